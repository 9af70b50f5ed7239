"""Release checkpoints <-> mmppma checkpoints, checked: the converter behind
``tools/model_converters/release_to_mmppma.py`` and whole-model conversion, for the families PPMA (with RMT),
MLLA and VMINet (layout: docs/method.md §8, docs/checkpoints.md).

Each family's key map and revision rules are data beside its backbone (``mmppma/models/backbones/
<family>_release.py``, applied by :func:`~mmppma.models.backbones.release.from_release`). This module adds
what needs the models: the arch detected from the shapes, and a check of every key and shape against a reference
model built on the meta device from the backbone's arch table (or from a given config); anything missing,
unexpected or mis-shaped raises :class:`CheckpointMismatchError` listing the keys. The default config to load a
converted classifier with is named in ``info['config']`` relative to the mmppma repository (``configs/...``);
no file is read here unless a config is given.
"""
import functools
import inspect
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple, Union

import torch

from ...utils.checks import renamed_attributes
from ..backbones import mlla_release, ppma_release, vminet_release
from ..backbones.mlla import MLLA, MLLA_ARCH_ZOO
from ..backbones.ppma import ARCH_ZOO as PPMA_ARCH_ZOO
from ..backbones.ppma import PPMA, RMT
from ..backbones.release import CheckpointMismatchError, convert_and_check, extract_state_dict, match_arch_name
from ..backbones.release import prefixed as _prefixed
from ..backbones.vminet import ARCH_ZOO as VMINET_ARCH_ZOO
from ..backbones.vminet import VMINet

__all__ = ['RELEASE_FAMILIES', 'CheckpointMismatchError', 'check_family', 'canonical_arch', 'extract_state_dict',
           'match_arch', 'release_to_mmppma', 'mmppma_to_release', 'with_release_record', 'mlla_rope_rotations']

#: the release layouts converted; 'RMT' is PPMA's fixed-decay baseline in the same layout (family 'PPMA')
RELEASE_FAMILIES = ('PPMA', 'MLLA', 'VMINet')
__getattr__ = renamed_attributes(__name__, FAMILIES='RELEASE_FAMILIES')
FORMATS = {'PPMA': ppma_release, 'MLLA': mlla_release, 'VMINet': vminet_release}
ZOOS = {'PPMA': PPMA_ARCH_ZOO, 'MLLA': MLLA_ARCH_ZOO, 'VMINet': VMINET_ARCH_ZOO}
with_release_record = vminet_release.with_release_record
mlla_rope_rotations = mlla_release.rope_rotations


def check_family(family: str) -> str:
    """'ppma' / 'RMT' / 'mlla' / ... -> the family name in :data:`RELEASE_FAMILIES` ('RMT' is 'PPMA')."""
    if isinstance(family, str) and family.lower() == 'rmt':
        return 'PPMA'
    for f in RELEASE_FAMILIES:
        if isinstance(family, str) and family.lower() == f.lower():
            return f
    raise ValueError(f'family={family!r}; choose one of {", ".join(RELEASE_FAMILIES)} (RMT: PPMA)')


def canonical_arch(family: str, arch: str) -> str:
    """'tiny' / 'T' / 't' ... -> the family's config name ('tiny' for PPMA, 't' for MLLA, 'ti' for VMINet)."""
    zoo = ZOOS[family]
    if arch.lower() not in zoo:
        raise ValueError(f'arch={arch!r} is not a {family} arch; choose one of {", ".join(sorted(zoo))}')
    return next(name for name in FORMATS[family].ARCH_NAMES if zoo[name] == zoo[arch.lower()])


def match_arch(family: str, measured: dict) -> str:
    """The canonical arch name whose table entry equals the measured settings (from the family's ``inspect``)."""
    fmt, zoo = FORMATS[family], ZOOS[family]
    name = match_arch_name(zoo, fmt.ARCH_NAMES, measured, fmt.IMPLIED)
    if name is not None:
        return name
    shown = ', '.join(f'{k}={v}' for k, v in measured.items() if k in zoo[fmt.ARCH_NAMES[0]])
    hint = ('pass arch=dict(...) with attn_types (converter --arch-json)' if family == 'PPMA' else
            'pass a config whose model matches (converter --config)')
    table = 'arch in ARCH_ZOO' if family == 'PPMA' else 'named arch'
    raise CheckpointMismatchError(f'{family} backbone ({shown}) matches no {table} '
                                  f'({", ".join(fmt.ARCH_NAMES)}); {hint}')


# ---------------------------------------------------------------- reference models
def build_reference_backbone(family: str, arch: Union[str, dict], **kwargs) -> torch.nn.Module:
    """The family's backbone (``family`` 'PPMA', 'RMT', 'MLLA' or 'VMINet') from its arch table, on the meta
    device (shapes only), for key/shape checks."""
    cls = {'PPMA': PPMA, 'RMT': RMT, 'MLLA': MLLA, 'VMINet': VMINet}[family]
    with torch.device('meta'):
        return cls(arch, **kwargs)


def build_model_from_config(config: Union[str, Path], backbone_overrides: Optional[dict] = None,
                            backbone_only: bool = False, device: Union[str, torch.device] = 'meta'):
    """The config's mmpretrain model (or only its backbone), with ``backbone_overrides`` applied, on ``device``
    ('meta': shapes only, no memory; :func:`mmppma.utils.configs.build_config_model`)."""
    from mmppma.utils.configs import build_config_model, load_config
    cfg = load_config(config)
    cfg.model.pop('train_cfg', None)  # batch augments: no state, only a log line
    return build_config_model(cfg, backbone_only=backbone_only, backbone_overrides=backbone_overrides, device=device)


@functools.lru_cache(maxsize=None)
def _config_shapes(config: str, overrides: Tuple[Tuple[str, object], ...], backbone_only: bool) -> dict:
    model = build_model_from_config(config, dict(overrides), backbone_only)
    return {k: torch.empty(v.shape, device='meta') for k, v in model.state_dict().items()}


def config_reference_state(config: Union[str, Path], backbone_overrides: Optional[dict] = None,
                           backbone_only: bool = False) -> Dict[str, torch.Tensor]:
    """Keys -> meta tensors of the model built from ``config`` (cached per config and overrides)."""
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (backbone_overrides or {}).items()))
    return dict(_config_shapes(str(config), items, backbone_only))


def default_config(family: str, arch: str, revision: Optional[str] = None, variant: Optional[str] = None) -> str:
    """The repository config for a converted classifier, relative to the mmppma repository root:
    ``configs/<family>_<arch>_8xb128_in1k.py``, or ``configs/vminet_<arch>_release-<revision>_in1k.py``."""
    if revision:
        return f'configs/vminet_{arch}_release-{revision}_in1k.py'
    name = (variant or family).lower()
    return f'configs/{name}_{arch[0] if family == "PPMA" else arch}_8xb128_in1k.py'


def check_config_options(config: Union[str, Path], revision: str) -> None:
    """The config's backbone must have the VMINet release revision's options (:data:`RELEASE_REVISIONS`)."""
    from mmppma.utils.configs import load_config
    backbone = load_config(config).model.backbone
    defaults = inspect.signature(VMINet.__init__).parameters
    needed = vminet_release.RELEASE_REVISIONS[revision]
    wrong = {k: v for k, v in needed.items() if backbone.get(k, defaults[k].default) != v}
    if wrong:
        raise CheckpointMismatchError(
            f'{config}: model.backbone has ' + ', '.join(f'{k}={backbone.get(k, defaults[k].default)!r}' for k in wrong)
            + f'; the release revision {revision} needs ' + ', '.join(f'{k}={v!r}' for k, v in wrong.items())
            + ' (configs/vminet_<arch>_release-' + revision + '_in1k.py has them)')


def _reference_backbone_state(family: str, arch: Union[str, dict], measured: dict, overrides: dict,
                              downstream: bool, release: Optional[dict]) -> Dict[str, torch.Tensor]:
    """The backbone the converted state must fit, from the arch table: the classifier's (last stage only,
    the release's output norm) or the dense one with the output norms found in the checkpoint."""
    last = len(measured['depths']) - 1
    out_norms = measured['out_norms']
    if family == 'PPMA':
        mask = {} if measured['variant'] == 'RMT' else dict(mask=measured['mask'])
        dense = dict(out_indices=out_norms or (last, ), out_norm=bool(out_norms))
        return build_reference_backbone(measured['variant'], arch, **mask, **dense).state_dict()
    if family == 'MLLA':
        dense = dict(out_indices=out_norms or (last, ), out_norm=bool(out_norms)) if downstream else \
            dict(out_indices=(last, ), out_norm=True)
        return build_reference_backbone('MLLA', arch, **dense).state_dict()
    dense = dict(out_indices=out_norms or tuple(range(last + 1)), out_norm=measured['out_norm_type']) if downstream \
        else dict(out_indices=(last, ), out_norm='BN')
    options = {k: v for k, v in (release or {}).items() if k != 'revision'}
    return build_reference_backbone('VMINet', arch, **dense, **options, **overrides).state_dict()


def _classifier_head(family: str, head: dict, backbone_dims: int, info: dict) -> Dict[str, torch.Tensor]:
    """The head the converted state must fit, from the checkpoint's class count: PPMAClsHead, or mmpretrain's
    LinearClsHead (``head.fc``) on the last stage's channels."""
    if 'head.fc.weight' not in head:
        raise CheckpointMismatchError('classification checkpoint without head (no head.weight); convert with '
                                      'backbone_only=True (--backbone-only)')
    num_classes = head['head.fc.weight'].shape[0]
    info['num_classes'] = num_classes
    if num_classes != 1000:
        info['notes'].append(f'{num_classes} classes: set model.head.num_classes={num_classes}')
    if family == 'PPMA':
        from ..heads import PPMAClsHead
        hidden = head['head.fc.weight'].shape[1]
        in_channels = head['head.proj.weight'].shape[1] if 'head.proj.weight' in head else -1
        with torch.device('meta'):
            ref = PPMAClsHead(num_classes, in_channels, hidden, loss=torch.nn.Identity())
        return _prefixed(ref.state_dict(), 'head.')
    return {'head.fc.weight': torch.empty(num_classes, backbone_dims, device='meta'),
            'head.fc.bias': torch.empty(num_classes, device='meta')}


def _config_reference(family: str, conversion, config, backbone_only: bool) -> Dict[str, torch.Tensor]:
    """The keys and shapes of the model of a given mmpretrain config (classification: the classifier, its head
    for the checkpoint's class count; downstream: its backbone with the checkpoint's output norms)."""
    info, measured, head = conversion.info, conversion.measured, conversion.head
    if info['release']:
        check_config_options(config, info['release']['revision'])
    overrides, last = info['backbone_overrides'], len(measured['depths']) - 1
    if info['downstream']:
        if family == 'VMINet':
            dense = dict(out_indices=measured['out_norms'] or tuple(range(last + 1)),
                         out_norm=measured['out_norm_type'])
        else:
            dense = dict(out_indices=measured['out_norms'] or (last, ), out_norm=bool(measured['out_norms']))
        return _prefixed(config_reference_state(config, dict(overrides, **dense), backbone_only=True), 'backbone.')
    ref = config_reference_state(config, overrides)
    if backbone_only:
        return {k: v for k, v in ref.items() if k.startswith('backbone.')}
    if 'head.fc.weight' not in head:
        raise CheckpointMismatchError('classification checkpoint without head (no head.weight); convert with '
                                      'backbone_only=True (--backbone-only)')
    num_classes = head['head.fc.weight'].shape[0]
    if 'head.fc.weight' in ref and ref['head.fc.weight'].shape[0] != num_classes:
        ref['head.fc.weight'] = torch.empty(num_classes, ref['head.fc.weight'].shape[1], device='meta')
        ref['head.fc.bias'] = torch.empty(num_classes, device='meta')
        info['notes'].append(f'{num_classes} classes: set model.head.num_classes={num_classes}')
    info['num_classes'] = num_classes
    return ref


# ---------------------------------------------------------------- the API
def release_to_mmppma(state: Mapping[str, torch.Tensor],
                      family: str,
                      backbone_only: bool = False,
                      arch: Optional[Union[str, dict]] = None,
                      config: Optional[Union[str, Path]] = None,
                      check: bool = True) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Convert a release state dict (classification, or ``backbone.``-prefixed downstream) of ``family``
    ('PPMA' / 'RMT', 'MLLA', 'VMINet') to mmppma keys, through
    :func:`~mmppma.models.backbones.release.convert_and_check` against a reference model.

    Returns (state dict, info). Classification: ``backbone.*`` + the head (PPMA: ``head.{proj,norm,fc}.*`` of
    PPMAClsHead; MLLA / VMINet: the release's final ``norm`` as ``backbone.norm{last}`` and ``head.fc.*`` of
    mmpretrain's LinearClsHead). Downstream: the backbone under ``backbone.`` (its output norms kept), the
    detector's / segmentor's own keys passed through unchecked unless ``backbone_only``. ``backbone_only``:
    only ``backbone.*`` keys (for ``init_cfg=dict(type='Pretrained', prefix='backbone.')``).

    ``arch``: detected from shapes unless given (a name; PPMA also a settings dict). ``check``: every key and
    shape against the reference model, built from the arch table, or from ``config`` (an mmpretrain
    classification config) when given; VMINet: a given config must have the release revision's options.

    ``info``: family ('PPMA' | 'RMT' | 'MLLA' | 'VMINet'), arch, config (the given one, else the repository
    config to load a converted classifier with, relative to the repository root, e.g.
    ``configs/mlla_t_8xb128_in1k.py``; None for a custom arch), downstream, out_indices, backbone_overrides
    (settings the checkpoint needs that differ from the backbone's defaults), dropped (release buffers with no
    counterpart), passthrough keys, num_classes, notes, mask (PPMA), and ``revision`` / ``release`` (VMINet:
    the record revision, context_mask, proj_norm; None for a downstream state in mmppma's layout). A VMINet
    release state comes back carrying the record (:func:`with_release_record`).
    """
    family = check_family(family)

    def reference(conversion) -> Optional[Dict[str, torch.Tensor]]:
        measured, info = conversion.measured, conversion.info
        chosen = arch
        if isinstance(chosen, str):
            chosen = canonical_arch(family, chosen)
        elif chosen is None:
            try:
                chosen = match_arch(family, measured)
            except CheckpointMismatchError:
                if check and config is None:
                    raise
        info['arch'] = chosen
        if config is not None:
            info['config'] = str(config)
        elif isinstance(chosen, str) and (family != 'PPMA' or measured['mask'] in ('polyline', 'rmt')):
            info['config'] = default_config(family, chosen, info['revision'], info['family'])
        else:
            info['config'] = None
        if not check:
            return None
        downstream = info['downstream']
        passthrough = conversion.rest if downstream and not backbone_only else {}
        if config is not None:
            return {**_config_reference(family, conversion, config, backbone_only), **passthrough}
        ref = _reference_backbone_state(family, chosen, measured, info['backbone_overrides'], downstream,
                                        info['release'])
        expected = {**_prefixed(ref, 'backbone.'), **passthrough}
        if not downstream and not backbone_only:
            expected.update(_classifier_head(family, conversion.head, measured['embed_dims'][-1], info))
        return expected

    out, conversion = convert_and_check(state, FORMATS[family], reference, f'{family} release checkpoint',
                                        backbone_only=backbone_only, arch_zoo=ZOOS[family])
    release = conversion.info['release']
    return (with_release_record(out, release) if release else out), conversion.info


def mmppma_to_release(state: Mapping[str, torch.Tensor],
                      family: str,
                      downstream: bool = False,
                      img_size: int = 224,
                      revision: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """Inverse of :func:`release_to_mmppma` (classification, or downstream with ``downstream=True``): the
    family module's ``to_release``. MLLA: the RoPE buffers are regenerated for ``img_size`` (the releases use
    224). VMINet: ``revision='7c2632c'`` writes that revision's block names (``conv`` for ``dwconv``); the
    default is the revision the state records (:func:`with_release_record`), else '6b11d4a'."""
    family = check_family(family)
    if family == 'PPMA':
        return ppma_release.to_release(state, downstream)
    if family == 'MLLA':
        return mlla_release.to_release(state, downstream, img_size)
    return vminet_release.to_release(state, downstream, revision)
