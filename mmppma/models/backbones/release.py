"""Release checkpoints as data: each backbone family's release format (in its spec file, ``ppma_spec``, ``mlla_spec``,
``vminet_spec``; :mod:`.family`) holds its key map and revision rules;
:func:`from_release` applies one of them, and :func:`convert_and_check` - the one route of a release state dict
into a model - converts, checks and logs.

A release format (a module or namespace) provides ``FAMILY``, ``ROOTS`` (the backbone's key prefixes in a
classification release), ``ARCH_NAMES`` (the canonical arch names, in detection order), ``IMPLIED`` (arch settings
the weights do not show), ``HEAD_IN_BACKBONE`` (a classifier's head part maps keys into the backbone, its final
norm, which a backbone-only conversion keeps),
``measure(backbone)`` (the settings visible in shapes, ``out_norms`` and ``out_norm`` among them),
``map_backbone(backbone, measured, downstream, info)``, ``map_head(rest, last)``, ``release_only(state)`` (keys
only the release has) and ``to_release(state, downstream, ...)``. A backbone's format is its family's
(:func:`family_format`).

Loading (no conversion command needed):

* a backbone's ``init_cfg=dict(type='Pretrained', checkpoint=...)`` with a classification release file: its
  backbone part is converted and loaded (:func:`load_release_into_backbone`, from ``init_weights``);
* a whole model holding an mmppma backbone (mmpretrain's ``init_model`` / ``get_model``, ``load_state_dict``,
  mmengine's ``load_checkpoint``): a load-state-dict pre-hook on the backbone's parent converts the release
  state dict before the parent loads it (:func:`install_parent_hook`, a torch module-registration hook that
  ``import mmppma`` installs). The hook sits on the parent because torch hands a child only the keys under
  its own prefix, and a release file has none: its backbone keys are at the root, beside ``head.weight``.
  The parent is a class of mmpretrain (or the user's), built by their code, so mmppma's first chance to
  reach it is the moment the backbone is registered as its child.

Either way, as for timm's pretrained filter and the converter (:mod:`mmppma.models.conversion`), the state goes through
:func:`convert_and_check`: the converted keys are checked against the module that receives them
(:class:`CheckpointMismatchError` names the missing, unexpected and mis-shaped ones) and one line is logged. Loading a
classification release into a dense backbone leaves the output norms the release has no weights for at their
initialization, and says so in the log.
"""
import functools
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn

from .family import FAMILIES, family_of

STATE_KEYS = ('model', 'model_ema', 'models', 'state_dict')
_HOOKED = '_mmppma_release_hook'


class CheckpointMismatchError(ValueError):
    """A checkpoint whose keys or shapes do not match the model they are meant for."""


# ---------------------------------------------------------------- containers and checks
def extract_state_dict(checkpoint: Mapping, key: Optional[str] = None) -> Tuple[Dict[str, torch.Tensor], str]:
    """The release's state dict and where it was: ``key`` if given, else the first of ``model``, ``model_ema``,
    ``models``, ``state_dict``, then ``state_dict_ema`` (timm's EMA copy) present; a bare state dict is
    returned as is. A ``module.`` (DDP) prefix on every key is removed."""
    if key is not None:
        if key not in checkpoint:
            raise KeyError(f'checkpoint has no {key!r}; its top-level keys are {sorted(checkpoint)}')
        state, where = dict(checkpoint[key]), key
    else:
        where = next((k for k in STATE_KEYS + ('state_dict_ema', ) if isinstance(checkpoint.get(k), Mapping)), None)
        if where is not None:
            state = dict(checkpoint[where])
        elif checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
            state, where = dict(checkpoint), ''
        else:
            raise KeyError(f'no state dict found under {", ".join(STATE_KEYS)}, state_dict_ema; top-level keys are '
                           f'{sorted(checkpoint)}. Name the right one (converter --key).')
    if state and all(k.startswith('module.') for k in state):
        state = {k[len('module.'):]: v for k, v in state.items()}
    return state, where


def prefixed(state: Mapping[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    return {f'{prefix}{k}': v for k, v in state.items()}


# ---------------------------------------------------------------- helpers of the family modules
def stage_count(backbone: Mapping, root: str) -> int:
    n = 0
    while any(k.startswith(f'{root}.{n}.') for k in backbone):
        n += 1
    return n


def block_indices(backbone: Mapping, pattern: str) -> List[int]:
    return sorted({int(m.group(1)) for k in backbone for m in [re.match(pattern, k)] if m})


def out_norm_indices(backbone: Mapping, name: str = 'norm') -> Tuple[int, ...]:
    return tuple(sorted(int(m.group(1)) for k in backbone for m in [re.fullmatch(rf'{name}(\d+)\.weight', k)] if m))


def linear_head(rest: Mapping[str, torch.Tensor], last: int) -> Tuple[dict, dict]:
    """A release classifier's ``norm`` (-> ``backbone.norm{last}``) and ``head`` (-> mmpretrain's
    ``LinearClsHead`` ``head.fc``); any other key passes through as a head key (the checks report it)."""
    to_backbone, head = {}, {}
    for k, v in rest.items():
        if k.startswith('norm.'):
            to_backbone[f'backbone.norm{last}.{k[len("norm."):]}'] = v
        elif k.startswith('head.'):
            head[f'head.fc.{k[len("head."):]}'] = v
        else:
            head[k] = v
    return to_backbone, head


def linear_head_to_release(backbone: dict, others: dict, stages: int) -> dict:
    """Inverse of :func:`linear_head` on a classifier state split into backbone keys and the rest."""
    out, final = {}, f'norm{stages - 1}.'
    for k, v in backbone.items():
        out['norm.' + k[len(final):] if k.startswith(final) else k] = v
    for k, v in others.items():
        out['head.' + k[len('head.fc.'):] if k.startswith('head.fc.') else k] = v
    return out


def article(name: str) -> str:
    """'a' or 'an' before a family's name: 'an' before a vowel, or an initialism spoken from a vowel (MLLA, RMT)."""
    spoken = name[0] in 'AEIOU' or (name[:2].isupper() and name[0] in 'FHLMNRSX')
    return 'an' if spoken else 'a'


def with_release_record(state: Mapping[str, torch.Tensor], record: dict,
                        key: str) -> 'OrderedDict[str, torch.Tensor]':
    """``state`` as an OrderedDict whose load metadata (``_metadata``, kept by torch.save / torch.load and by
    mmengine's ``load_checkpoint``) holds ``record`` as ``key`` (the family's ``FamilySpec.record``) at the root and
    under ``backbone``."""
    out = OrderedDict(state)
    out._metadata = OrderedDict((prefix, {key: dict(record)}) for prefix in ('', 'backbone'))
    return out


def read_release_record(filename: str, key: str, prefix: str = '') -> Optional[dict]:
    """The release record ``key`` of a checkpoint file (its state dict's metadata for ``prefix``, else its
    ``meta``), or None."""
    from mmengine.runner.checkpoint import _load_checkpoint
    checkpoint = _load_checkpoint(filename, map_location='cpu')
    state = checkpoint.get('state_dict', checkpoint)
    record = (getattr(state, '_metadata', None) or {}).get(prefix.rstrip('.'), {}).get(key)
    meta = checkpoint.get('meta')
    if record is None and isinstance(meta, Mapping):
        record = meta.get(key)
    return record


# ---------------------------------------------------------------- applying a family's format
@dataclass
class Conversion:
    """What :func:`from_release` read and made: the mapped backbone keys (no prefix), the head keys (ours) and
    those moved into the backbone, the downstream model's own keys (``rest``), the settings visible in the
    shapes (``measured``) and ``info`` (family, downstream, out_indices, backbone_overrides, dropped, notes,
    revision, release; PPMA: mask)."""
    backbone: dict
    head: dict
    to_backbone: dict
    rest: dict
    measured: dict
    info: dict = field(default_factory=dict)
    fmt: Optional[Any] = None

    def state(self, backbone_only: bool = False) -> Dict[str, torch.Tensor]:
        """The converted state dict: ``backbone.*``, then the head (classification) or the downstream model's
        keys, unless ``backbone_only``."""
        out = {**prefixed(self.backbone, 'backbone.'), **self.to_backbone}
        if not backbone_only:
            out.update(self.rest if self.info['downstream'] else self.head)
        return out


def split_state(fmt: Any, state: Mapping[str, torch.Tensor]) -> Tuple[bool, dict, dict]:
    """(downstream?, backbone keys without any ``backbone.`` prefix, everything else)."""
    downstream = any(k.startswith('backbone.') for k in state)
    backbone, rest = {}, {}
    for k, v in state.items():
        if downstream and k.startswith('backbone.'):
            backbone[k[len('backbone.'):]] = v
        elif not downstream and k.startswith(fmt.ROOTS):
            backbone[k] = v
        else:
            rest[k] = v
    return downstream, backbone, rest


def from_release(state: Mapping[str, torch.Tensor], fmt: Any, backbone_only: bool = False) -> Conversion:
    """Apply the release format ``fmt`` to a release state dict (classification, or ``backbone.``-prefixed
    downstream): keys only, no check against a model (the caller checks against the module it loads)."""
    downstream, backbone, rest = split_state(fmt, state)
    if not backbone:
        raise CheckpointMismatchError(f'not {article(fmt.FAMILY)} {fmt.FAMILY} backbone: no '
                                      f'{"backbone." if downstream else ""}{"* / ".join(fmt.ROOTS)}* keys; keys start '
                                      f'with {sorted(state)[:5]}')
    measured = fmt.measure(backbone)
    info = dict(family=measured.get('variant', fmt.FAMILY), downstream=downstream, backbone_overrides={},
                dropped=[], passthrough=[], out_indices=measured['out_norms'], notes=[], revision=None, release=None)
    if 'mask' in measured:
        info['mask'] = measured['mask']
    backbone = fmt.map_backbone(backbone, measured, downstream, info)
    skip_head = downstream or (backbone_only and not fmt.HEAD_IN_BACKBONE)
    to_backbone, head = ({}, {}) if skip_head else fmt.map_head(rest, len(measured['depths']) - 1)
    if downstream and not backbone_only:
        info['passthrough'] = sorted(rest)
    return Conversion(backbone, head, to_backbone, rest, measured, info, fmt)


# ---------------------------------------------------------------- the one route of a release state dict
def family_format(backbone: nn.Module) -> Any:
    """The release format of an mmppma backbone (its family's, :func:`~.family.family_of`)."""
    return family_of(type(backbone)).release


def is_family_backbone(module: nn.Module) -> bool:
    """Whether ``module`` is a backbone of a registered family."""
    return any(isinstance(module, v.backbone) for spec in FAMILIES.values() for v in spec.variants)


def is_release_layout(state: Mapping[str, torch.Tensor], fmt: Any) -> bool:
    """Whether ``state`` is a classification release state dict of the family ``fmt``: its backbone keys at
    the root (no ``backbone.`` prefix) with the release's ``head.weight`` (the mmppma classifier has
    ``head.fc.weight``), or keys only the release has (``fmt.release_only``)."""
    if not state or any(k.startswith('backbone.') for k in state):
        return False
    if not any(k.startswith(fmt.ROOTS) for k in state):
        return False
    return 'head.weight' in state or fmt.release_only(state)


def unwrap_state(checkpoint: Mapping) -> Mapping:
    """A release checkpoint file's state dict as mmengine hands it over (the whole file when it has no
    ``state_dict``): the dict under ``model`` (or ``model_ema``, ``models``, ``state_dict_ema``; see
    :func:`extract_state_dict`), else ``checkpoint`` itself."""
    if not any(isinstance(v, Mapping) for v in checkpoint.values()):
        return checkpoint
    try:
        return extract_state_dict(checkpoint)[0]
    except KeyError:
        return checkpoint


def match_arch_name(zoo: Mapping[str, dict], names, measured: dict, implied: Optional[dict] = None) -> Optional[str]:
    """The first of ``names`` whose ``zoo`` entry (with the ``implied`` settings) equals the measured ones."""
    for name in names:
        settings = dict(zoo[name], **(implied or {}))
        if all(settings[k] == measured[k] for k in settings if k in measured):
            return name
    return None


KeyRule = Optional[Callable[[str], bool]]


def check_keys(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], where: str, *,
               keep: KeyRule = None, drop: KeyRule = None,
               loose_shapes: KeyRule = None) -> Tuple[Dict[str, torch.Tensor], List[str], List[str]]:
    """``state`` against the keys and shapes of ``expected`` (the receiving module's state dict): returns
    (``state`` without the keys ``expected`` lacks, the expected keys it lacks that ``keep`` allows, its keys
    ``expected`` lacks that ``drop`` allows). Any other missing, unexpected or (unless ``loose_shapes``) mis-shaped
    key raises :class:`CheckpointMismatchError` naming them all."""
    kept = sorted(k for k in expected if k not in state and keep is not None and keep(k))
    dropped = sorted(k for k in state if k not in expected and drop is not None and drop(k))
    missing = sorted(set(expected) - set(state) - set(kept))
    unexpected = sorted(set(state) - set(expected) - set(dropped))
    shapes = sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}'
                    for k in set(state) & set(expected)
                    if tuple(state[k].shape) != tuple(expected[k].shape) and not (loose_shapes and loose_shapes(k)))
    if missing or unexpected or shapes:
        raise CheckpointMismatchError(f'{where}: {len(missing)} missing keys {missing}, {len(unexpected)} unexpected '
                                      f'keys {unexpected}, {len(shapes)} shape mismatches {shapes}')
    return {k: v for k, v in state.items() if k in expected}, kept, dropped


def load_report(where: str, conversion: Conversion, tensors: int, arch_zoo: Optional[Mapping] = None) -> str:
    """The one log line of :func:`convert_and_check`."""
    info, fmt = conversion.info, conversion.fmt
    arch = match_arch_name(arch_zoo, fmt.ARCH_NAMES, conversion.measured, fmt.IMPLIED) if arch_zoo else None
    parts = [f'{where}: converted from the {info["family"]}{"-" + arch if arch else ""} release, {tensors} tensors']
    if info.get('release'):
        parts.append(f'release revision {info["release"]["revision"]}')
    if info['dropped']:
        parts.append(f'{len(info["dropped"])} release buffers dropped (recomputed by mmppma)')
    if info['unused']:
        parts.append(f'{len(info["unused"])} tensors this model does not take: {info["unused"]}')
    if info['kept']:
        parts.append(f'{len(info["kept"])} tensors the checkpoint has no weights for keep their initialization: '
                     f'{info["kept"]}')
    return '; '.join(parts + info['notes'])


def convert_and_check(state: Mapping[str, torch.Tensor], fmt: Any,
                      target: Union[None, Mapping[str, torch.Tensor], Callable[[Conversion], Optional[Mapping]]],
                      where: str, *, backbone_only: bool = False, rename: Optional[Callable[[str], str]] = None,
                      keep: KeyRule = None, drop: KeyRule = None, loose_shapes: KeyRule = None,
                      check_record: Optional[Callable[[dict], None]] = None, arch_zoo: Optional[Mapping] = None,
                      hint: str = '', log: bool = True) -> Tuple[Dict[str, torch.Tensor], Conversion]:
    """The one route of a release state dict (classification, or ``backbone.``-prefixed downstream) of the
    family ``fmt`` into a model, for every caller (a backbone's ``init_cfg``, the load hook of its parent, timm's
    pretrained filter, the converter):

    1. detect and convert (:func:`from_release`: the layout, the settings in the shapes, the revision); keys
       outside a classification release's backbone and head are an error;
    2. ``check_record(info)``: the release revision's options against the model's (raises naming them);
    3. check against ``target``, the receiving module's state dict (or a function of the conversion giving it;
       None: no check), key for key and shape for shape (:func:`check_keys`: ``keep``, ``drop``,
       ``loose_shapes``), after ``rename`` maps the converted keys to the target's;
    4. one log line (:func:`load_report`; ``arch_zoo``: the arch table whose name it reports).

    Returns (the converted state dict, only the target's keys; the :class:`Conversion`, whose ``info`` adds
    ``kept`` and ``unused``). Every error ends with ``hint``."""
    try:
        conversion = from_release(dict(state), fmt, backbone_only)
        stray = sorted(k for k in conversion.head if not k.startswith('head.'))
        if stray:
            raise CheckpointMismatchError(f'{fmt.FAMILY} release checkpoint: {len(stray)} unexpected keys {stray} '
                                          'outside its backbone and head')
        converted = conversion.state(backbone_only)
        if rename is not None:
            converted = {rename(k): v for k, v in converted.items()}
        if check_record is not None and conversion.info.get('release'):
            check_record(conversion.info['release'])
        expected = target(conversion) if callable(target) else target
        kept, unused = [], []
        if expected is not None:
            converted, kept, unused = check_keys(converted, expected, where, keep=keep, drop=drop,
                                                 loose_shapes=loose_shapes)
    except ValueError as err:  # CheckpointMismatchError and the record check's
        if hint:
            raise type(err)(f'{err}. {hint}') from err
        raise
    conversion.info.update(kept=kept, unused=unused)
    if log:
        _log(load_report(where, conversion, len(converted), arch_zoo))
    return converted, conversion


def _log(message: str) -> None:
    from mmengine.logging import print_log
    print_log(message, logger='current')


def _record_check(backbone: nn.Module) -> Optional[Callable[[dict], None]]:
    return getattr(backbone, 'check_release_record', None)


def load_release_into_backbone(backbone: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> dict:
    """Convert a classification release state dict and load its backbone part into ``backbone``
    (:func:`convert_and_check`). The output norms of a dense backbone (``out_indices`` of several stages) the
    release has no weights for keep their initialization; the classifier's head (and, for a backbone with
    LayerNorm outputs, the release's final norm) is not used. Returns the conversion's info."""
    fmt = family_format(backbone)
    final = f'norm{len(backbone.depths) - 1}.'
    norms = tuple(f'{backbone.out_norm_name(i)}.' for i in backbone.out_indices
                  if backbone.out_norm_module(i) is not None)
    weights, conversion = convert_and_check(
        state, fmt, backbone.state_dict(), f'{fmt.FAMILY} release checkpoint {source} -> '
        f'{type(backbone).__name__} init_cfg',
        rename=lambda k: k[len('backbone.'):] if k.startswith('backbone.') else k,
        keep=lambda k: k.startswith(norms) if norms else False, drop=lambda k: k.startswith(('head.', final)),
        check_record=_record_check(backbone), arch_zoo=type(backbone).arch_zoo)
    backbone.load_state_dict(weights, strict=False)
    return conversion.info


def read_checkpoint_state(filename: str) -> Dict[str, torch.Tensor]:
    """The state dict of a checkpoint file or URL, read with mmengine's checkpoint loaders (a URL is
    downloaded to, and read from, torch hub's cache)."""
    from mmengine.runner.checkpoint import CheckpointLoader
    checkpoint = CheckpointLoader.load_checkpoint(filename, map_location='cpu', logger='current')
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f'{filename}: a checkpoint must be a dict; got {type(checkpoint).__name__}')
    return extract_state_dict(checkpoint)[0]


def _release_pre_hook(module: nn.Module, state_dict: dict, prefix: str, local_metadata, strict, missing_keys,
                      unexpected_keys, error_msgs, child: str) -> None:
    """Load-state-dict pre-hook of a module whose child ``child`` is an mmppma backbone: a classification
    release state dict under ``prefix`` is replaced, in place, by its conversion, checked against ``module``
    (:func:`convert_and_check`). Any other state dict is left as it is."""
    backbone = module._modules.get(child)
    if backbone is None:
        return
    fmt = family_format(backbone)
    local = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    release = unwrap_state(local)
    if not is_release_layout(release, fmt):
        return
    expected = module.state_dict()
    where = f'{fmt.FAMILY} release checkpoint -> {type(module).__name__}'
    others = sorted({k.split('.')[0] for k in expected if not k.startswith((f'{child}.', 'head.'))})
    if others:
        raise CheckpointMismatchError(
            f'{where}: a classification release checkpoint holds only a backbone and a classification head, '
            f'this model also has {others}. Give it to the backbone instead: model.backbone.init_cfg='
            "dict(type='Pretrained', checkpoint=...) (no prefix needed; it is converted on load)")
    converted, _ = convert_and_check(
        release, fmt, expected, where,
        rename=lambda k: child + k[len('backbone'):] if k.startswith('backbone.') else k,
        check_record=_record_check(backbone), arch_zoo=type(backbone).arch_zoo)
    for k in local:
        del state_dict[prefix + k]
    state_dict.update({prefix + k: v for k, v in converted.items()})


def install_parent_hook(parent: nn.Module, name: str, child: nn.Module) -> None:
    """Module-registration hook: when an mmppma backbone becomes the child ``name`` of ``parent``, give the
    parent the release pre-hook (once per parent and child name)."""
    if not is_family_backbone(child):
        return
    hooked = parent.__dict__.setdefault(_HOOKED, set())
    if name in hooked:
        return
    hooked.add(name)
    parent._register_load_state_dict_pre_hook(functools.partial(_release_pre_hook, child=name), with_module=True)


_installed: Optional[object] = None


def register_release_loading() -> None:
    """Install :func:`install_parent_hook` as a torch module-registration hook (once per process)."""
    global _installed
    if _installed is None:
        _installed = torch.nn.modules.module.register_module_module_registration_hook(install_parent_hook)
