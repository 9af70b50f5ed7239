"""Backbones, each registered once (``mmppma.X`` everywhere, bare ``X`` after import), and their families: every
``<family>_spec.py`` module here is imported and registers its family's spec (:mod:`.family`)."""
import importlib
import pkgutil

from .family import FAMILIES, FamilySpec, Variant, family_of, register_family, variant_of
from .mlla import MLLA, MLLA_ARCH_ZOO, resolve_mlla_arch
from .ppma import ARCH_ZOO, PPMA, RMT, resolve_arch
from .vminet import ARCH_ZOO as VMINET_ARCH_ZOO
from .vminet import VMINet
from .vminet import resolve_arch as resolve_vminet_arch

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.endswith('_spec')):
    importlib.import_module(f'{__name__}.{_module}')

__all__ = ['ARCH_ZOO', 'PPMA', 'RMT', 'resolve_arch']
__all__ += ['MLLA', 'MLLA_ARCH_ZOO', 'resolve_mlla_arch']
__all__ += ['VMINet', 'VMINET_ARCH_ZOO', 'resolve_vminet_arch']
__all__ += ['FAMILIES', 'FamilySpec', 'Variant', 'family_of', 'register_family', 'variant_of']
