"""Backbones, each registered once (``mmppma.X`` everywhere, bare ``X`` after import)."""
from .ppma import ARCH_ZOO, PPMA, RMT, resolve_arch

__all__ = ['ARCH_ZOO', 'PPMA', 'RMT', 'resolve_arch']
