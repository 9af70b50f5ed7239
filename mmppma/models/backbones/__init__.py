"""Backbones, each registered once (``mmppma.X`` everywhere, bare ``X`` after import)."""
from .ppma import ARCH_ZOO, DROP_PATH_RATES, PPMA, RMT, resolve_arch

__all__ = ['ARCH_ZOO', 'DROP_PATH_RATES', 'PPMA', 'RMT', 'resolve_arch']
