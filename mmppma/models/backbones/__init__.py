"""Backbones, each registered once (``mmppma.X`` everywhere, bare ``X`` after import)."""
from .mlla import MLLA, MLLA_ARCH_ZOO, resolve_mlla_arch
from .ppma import ARCH_ZOO, PPMA, RMT, resolve_arch
from .vminet import ARCH_ZOO as VMINET_ARCH_ZOO
from .vminet import VMINet
from .vminet import resolve_arch as resolve_vminet_arch

__all__ = ['ARCH_ZOO', 'PPMA', 'RMT', 'resolve_arch']
__all__ += ['MLLA', 'MLLA_ARCH_ZOO', 'resolve_mlla_arch']
__all__ += ['VMINet', 'VMINET_ARCH_ZOO', 'resolve_vminet_arch']
