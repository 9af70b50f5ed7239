"""Backbones, each registered once (``mmppma.X`` everywhere, bare ``X`` after import)."""
from .ppma import ARCH_ZOO, PPMA, RMT, resolve_arch
from .mlla import MLLA, MLLA_ARCH_ZOO, resolve_mlla_arch
from .vminet import ARCH_ZOO as VMINET_ARCH_ZOO, VMINet, resolve_arch as resolve_vminet_arch

__all__ = ['ARCH_ZOO', 'PPMA', 'RMT', 'resolve_arch']
__all__ += ['MLLA', 'MLLA_ARCH_ZOO', 'resolve_mlla_arch']
__all__ += ['VMINet', 'VMINET_ARCH_ZOO', 'resolve_vminet_arch']
