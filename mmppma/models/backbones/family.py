"""Backbone families: one :class:`FamilySpec` per family, in its spec file beside the backbone
(``<family>_spec.py``), and the registry that conversion, timm, the model zoo, the tools and the tests loop over.

A family is one release layout of checkpoints (PPMA, MLLA, VMINet) and the models built in it, its variants
(:class:`Variant`; PPMA and RMT, MLLA and PPMLA, VMINet): each a backbone class with fixed options, named in timm
(``<variant>_<size>``, lower case), in the configs (``configs/<variant>_<arch>_...``) and in the model index.
A spec holds what every consumer needs to know about the family, and nothing else does:

* the backbone classes (their arch tables, ``arch_zoo``) and the timm sizes (timm size -> the arch name the
  configs use);
* the release format (``release``: a module or namespace providing ``FAMILY``, ``ROOTS``, ``ARCH_NAMES``,
  ``IMPLIED``, ``HEAD_IN_BACKBONE``, ``measure``, ``map_backbone``, ``map_head``, ``release_only`` and
  ``to_release``; :mod:`.release` applies it), the options the weights show, the load-metadata key that
  records a release revision;
* the release classifier's head (a name of :data:`mmppma.models.heads.RELEASE_HEADS`) and stem, the backbone
  options of the classifier and of the dense (mmdet / mmseg) backbone;
* the default config of a converted classifier, the metafile of the model index, the kernel tools' models.

``import mmppma.models.backbones`` imports every ``*_spec.py`` module of this package, and each registers its
spec (:func:`register_family`): a new family is its backbone file, its spec file and its configs. Code that
derives something per family (timm's model names) subscribes with :func:`on_register`.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

__all__ = ['FamilySpec', 'Variant', 'FAMILIES', 'register_family', 'on_register', 'family_of', 'variant_of',
           'variants']


@dataclass(frozen=True, eq=False)
class Variant:
    """A model of a family: ``backbone`` built with ``options``.

    Args:
        name: its name in the converter's ``info['family']`` and the tools ('PPMA', 'RMT', 'PPMLA'); lower case
            (:attr:`key`) in timm's names, the config file names and the model index.
        backbone: the backbone class (registered with mmengine by its module).
        options: backbone options of every model of the variant (PPMLA: ``mask='polyline'``; VMINet: those of the
            release revision its timm models and model index take).
        metafile: the model index's folder (``mmppma/.mim/metafiles/<metafile>/metafile.yml``), if it has one.
        paper, code: the paper id and code URL timm's pretrained cfg names.
        no_weights: where the weights are published when there is no direct download (timm's error).
        op: the :mod:`mmppma.ops` op its attention calls, whose implementation tools/benchmark_model.py reports
            (None: the variant takes no ``impl``).
        kernels: the kernel tools' op kind of each stage's attention (:mod:`.stages`): one kind for every stage,
            or a map from the arch table's ``attn_types`` entries; None: no kernel.
        release_model: the release's classification model factory, ``<release_model><T|S|B>`` in the release's
            ``<name>.py`` (tools/benchmark_model.py ``--release-dir``).
        baseline: the variant it is measured against (tools/benchmark_model.py's ratios: PPMA / RMT).
    """
    name: str
    backbone: type
    options: Mapping[str, Any] = field(default_factory=dict)
    metafile: Optional[str] = None
    paper: str = ''
    code: str = ''
    no_weights: str = ''
    op: Optional[str] = None
    kernels: Union[None, str, Mapping[str, str]] = None
    release_model: str = ''
    baseline: str = ''

    @property
    def key(self) -> str:
        """The lower-case name of timm's names, the configs and the model index ('ppma', 'rmt', 'ppmla')."""
        return self.name.lower()

    @property
    def family(self) -> 'FamilySpec':
        return family_of(self.name)

    def build(self, arch: Union[str, dict], *args, **kwargs):
        """The backbone: ``backbone(arch, *args, **options, **kwargs)`` (``kwargs`` over the options)."""
        return self.backbone(arch, *args, **{**self.options, **kwargs})

    def stage_kinds(self, arch: str) -> Tuple[str, ...]:
        """The kernel tools' op kind per stage of the named ``arch`` (:attr:`kernels`)."""
        settings = self.backbone.arch_zoo[arch]
        if isinstance(self.kernels, str):
            return (self.kernels, ) * len(settings['depths'])
        return tuple(self.kernels[t] for t in settings['attn_types'])


def _no_options(conversion) -> dict:
    return {}


def _every_info(info: Mapping) -> bool:
    return True


@dataclass(frozen=True, eq=False)
class FamilySpec:
    """One backbone family (see the module docstring).

    Args:
        release: the release format (a module or namespace, the protocol of :mod:`.release`); its ``FAMILY``
            is the family's name (:attr:`name`) and its ``ARCH_NAMES`` the canonical arch names, in detection order.
        variants: the family's models, the family's own backbone first.
        sizes: timm size name -> the arch name of the config files (``{'tiny': 't', ...}``).
        head: the release classifier's head, a name of :data:`mmppma.models.heads.RELEASE_HEADS`.
        stem: the stem's first convolution, under the backbone (timm's ``first_conv``).
        classifier_options: the backbone options of the release classifier (its output norm; out_indices is
            the last stage).
        dense_options: those of the mmdet / mmseg backbone (its output norms; out_indices every stage).
        weight_options: (the :class:`~.release.Conversion`) -> the backbone options that the converted weights
            need beyond the arch (PPMA: the mask; VMINet: the release revision's options).
        config: the converted classifier's repository config, relative to the repository root; fields
            ``variant`` (:attr:`Variant.key`) and ``arch`` (the config arch name, :meth:`config_arch`).
        revision_config: the config instead for a state of a release revision (``info['revision']``), with the
            field ``revision`` too.
        has_config: (the conversion's info) -> whether the repository ships that config.
        custom_arch: what a custom arch dict must name that the weights do not show, when a checkpoint that
            matches no named arch converts with ``arch=dict(...)`` (converter ``--arch-json``); '' : it needs a
            config instead.
        record: the load-metadata key under which a converted state records its release revision and options
            (:func:`~.release.with_release_record`), for a release format that sets ``info['release']``.
        kernel_models: the models of the kernel tools (:mod:`.stages`): label -> (variant name, arch name).
    """
    release: Any
    variants: Tuple[Variant, ...]
    sizes: Mapping[str, str]
    head: str
    stem: str
    classifier_options: Mapping[str, Any] = field(default_factory=dict)
    dense_options: Mapping[str, Any] = field(default_factory=dict)
    weight_options: Callable[[Any], dict] = _no_options
    config: str = 'configs/{variant}_{arch}_8xb128_in1k.py'
    revision_config: str = ''
    has_config: Callable[[Mapping], bool] = _every_info
    custom_arch: str = ''
    record: Optional[str] = None
    kernel_models: Mapping[str, Tuple[str, str]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.release.FAMILY

    @property
    def backbone(self) -> type:
        """The family's own backbone class (its first variant's)."""
        return self.variants[0].backbone

    @property
    def arch_zoo(self) -> Mapping[str, dict]:
        return self.backbone.arch_zoo

    @property
    def arch_names(self) -> Tuple[str, ...]:
        return tuple(self.release.ARCH_NAMES)

    def variant(self, name: str) -> Variant:
        """The variant named ``name`` (any case)."""
        found = [v for v in self.variants if v.key == name.lower()]
        if not found:
            raise ValueError(f'{name!r} is not a {self.name} variant; choose one of '
                             f'{", ".join(v.name for v in self.variants)}')
        return found[0]

    def canonical_arch(self, arch: str) -> str:
        """Any name of a named arch ('tiny', 'T', 't') -> its canonical name (the first of :attr:`arch_names`
        with the same table entry)."""
        zoo = self.arch_zoo
        if arch.lower() not in zoo:
            raise ValueError(f'arch={arch!r} is not a {self.name} arch; choose one of {", ".join(sorted(zoo))}')
        return next(name for name in self.arch_names if zoo[name] == zoo[arch.lower()])

    def config_arch(self, arch: str) -> str:
        """Any name of a named arch -> the name the config files use (a value of :attr:`sizes`)."""
        zoo = self.arch_zoo
        return next(name for name in self.sizes.values() if zoo[name] == zoo[arch.lower()])

    def default_config(self, arch: str, info: Mapping) -> Optional[str]:
        """The repository config to load a converted classifier of the named ``arch`` with (``info``: the
        conversion's: family, revision), or None when the repository has none for it."""
        if not self.has_config(info):
            return None
        revision = info.get('revision')
        return (self.revision_config if revision else self.config).format(
            variant=info['family'].lower(), arch=self.config_arch(arch), revision=revision)


#: the registered families by name, in registration order
FAMILIES: Dict[str, FamilySpec] = {}
_LISTENERS: List[Callable[[FamilySpec], None]] = []


def register_family(spec: FamilySpec) -> FamilySpec:
    """Register ``spec`` (from its spec file) and tell the :func:`on_register` listeners. Its family and variant
    names must be new (any case), its sizes and arch names names of its arch table. Returns ``spec``."""
    taken = {n.lower() for s in FAMILIES.values() for n in (s.name, *(v.name for v in s.variants))}
    names = [spec.name.lower()] + [v.key for v in spec.variants if v.key != spec.name.lower()]
    clash = sorted(set(names) & taken) + sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f'family {spec.name}: the names {clash} are taken (registered: {", ".join(FAMILIES)})')
    unknown = sorted({*spec.sizes.values(), *spec.arch_names} - set(spec.arch_zoo))
    if unknown:
        raise ValueError(f'family {spec.name}: arch names {unknown} are not in {spec.backbone.__name__}.arch_zoo')
    FAMILIES[spec.name] = spec
    for listener in _LISTENERS:
        listener(spec)
    return spec


def on_register(listener: Callable[[FamilySpec], None]) -> None:
    """Call ``listener(spec)`` for every family registered so far and every one registered later."""
    _LISTENERS.append(listener)
    for spec in list(FAMILIES.values()):
        listener(spec)


def variants() -> Iterator[Variant]:
    """Every registered variant, family by family."""
    for spec in FAMILIES.values():
        yield from spec.variants


def family_of(name: Union[str, type]) -> FamilySpec:
    """The family of a family or variant name (any case: 'rmt' is PPMA's) or of a backbone class (a variant's
    class or a subclass of one)."""
    if isinstance(name, type):
        for cls in name.__mro__:
            for spec in FAMILIES.values():
                if any(v.backbone is cls for v in spec.variants):
                    return spec
        known = ', '.join(dict.fromkeys(v.backbone.__name__ for v in variants()))
        raise TypeError(f'{name.__name__} is not an mmppma backbone ({known})')
    if isinstance(name, str):
        for spec in FAMILIES.values():
            if name.lower() in (spec.name.lower(), *(v.key for v in spec.variants)):
                return spec
    raise ValueError(f'family={name!r}; choose one of {", ".join(FAMILIES)} (or a variant: '
                     f'{", ".join(v.name for v in variants() if v.name != v.family.name)})')


def variant_of(name: str) -> Variant:
    """The variant of a name (any case): 'rmt', 'PPMLA', 'vminet'."""
    return family_of(name).variant(name)
