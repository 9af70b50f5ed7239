"""Release checkpoints <-> mmppma checkpoints, for the families PPMA (with RMT), MLLA and VMINet (layout:
docs/method.md §8).

One API: :func:`release_to_mmppma` (state dict, family) and its inverse :func:`mmppma_to_release`. mmppma's
backbones keep the releases' module names, so the backbone mapping is the identity under a ``backbone.``
prefix; what differs per family (head names, buffers, revisions): docs/checkpoints.md. The converted
state is checked key by key and shape by shape against a reference model built on the meta device from the
backbone's arch table (or from a given config); anything missing, unexpected or mis-shaped raises
:class:`CheckpointMismatchError` listing the keys. The default config to load a converted classifier with is
named in ``info['config']`` relative to the mmppma repository (``configs/...``); no file is read here unless
a config is given.
"""
import copy
import functools
import inspect
import math
import re
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

import torch

from ..backbones.mlla import MLLA, MLLA_ARCH_ZOO
from ..backbones.ppma import ARCH_ZOO as PPMA_ARCH_ZOO
from ..backbones.ppma import PPMA, RMT
from ..backbones.vminet import ARCH_ZOO as VMINET_ARCH_ZOO
from ..backbones.vminet import RELEASE_RECORD, RELEASE_REVISIONS, VMINet
from ..layers.mlla import mlla_rope_tables

#: the release layouts converted; 'RMT' is PPMA's fixed-decay baseline in the same layout (family 'PPMA')
FAMILIES = ('PPMA', 'MLLA', 'VMINet')
#: canonical (config file) arch names per family, in detection order
ARCH_NAMES = {'PPMA': ('tiny', 'small', 'base'), 'MLLA': ('t', 's', 'b'), 'VMINet': ('ti', 'xs', 's', 'b')}
ZOOS = {'PPMA': PPMA_ARCH_ZOO, 'MLLA': MLLA_ARCH_ZOO, 'VMINet': VMINET_ARCH_ZOO}
BACKBONE_ROOTS = {
    'PPMA': ('patch_embed.', 'layers.', 'outnorm'),
    'MLLA': ('patch_embed.', 'layers.'),
    'VMINet': ('stem.', 'stages.')
}
STATE_KEYS = ('model', 'model_ema', 'models', 'state_dict')
PPMA_HEAD_MAP = {'proj.': 'head.proj.', 'norm.': 'head.norm.', 'head.': 'head.fc.'}
ROPE_SUFFIX = '.attn.rope.rotations'
VMINET_OLD_CONV = re.compile(r'^(stages\.\d+\.[1-9]\d*\.)conv\.')  # revision 7c2632c: block's 7x7 ConvBN
VMINET_NEW_CONV = re.compile(r'^(stages\.\d+\.[1-9]\d*\.)dwconv\.')


class CheckpointMismatchError(ValueError):
    """A checkpoint whose keys or shapes do not match the model they are meant for."""


def check_family(family: str) -> str:
    """'ppma' / 'RMT' / 'mlla' / ... -> the family name in :data:`FAMILIES` ('RMT' is 'PPMA')."""
    if isinstance(family, str) and family.lower() == 'rmt':
        return 'PPMA'
    for f in FAMILIES:
        if isinstance(family, str) and family.lower() == f.lower():
            return f
    raise ValueError(f'family={family!r}; choose one of {", ".join(FAMILIES)} (RMT: PPMA)')


def canonical_arch(family: str, arch: str) -> str:
    """'tiny' / 'T' / 't' ... -> the family's config name ('tiny' for PPMA, 't' for MLLA, 'ti' for VMINet)."""
    zoo = ZOOS[family]
    if arch.lower() not in zoo:
        raise ValueError(f'arch={arch!r} is not a {family} arch; choose one of {", ".join(sorted(zoo))}')
    return next(name for name in ARCH_NAMES[family] if zoo[name] == zoo[arch.lower()])


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


def check_state_against(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise :class:`CheckpointMismatchError` listing missing, unexpected and mis-shaped keys."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}'
                    for k in set(state) & set(expected) if tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or shapes:
        raise CheckpointMismatchError(f'{what}: {len(missing)} missing keys {missing}, {len(unexpected)} unexpected '
                                      f'keys {unexpected}, {len(shapes)} shape mismatches {shapes}')


def split_state(family: str, state: Mapping[str, torch.Tensor]) -> Tuple[bool, dict, dict]:
    """(downstream?, backbone keys without any ``backbone.`` prefix, everything else)."""
    downstream = any(k.startswith('backbone.') for k in state)
    backbone, rest = {}, {}
    for k, v in state.items():
        if downstream and k.startswith('backbone.'):
            backbone[k[len('backbone.'):]] = v
        elif not downstream and k.startswith(BACKBONE_ROOTS[family]):
            backbone[k] = v
        else:
            rest[k] = v
    return downstream, backbone, rest


# ---------------------------------------------------------------- reading settings from shapes
def _stage_count(backbone: Mapping, root: str) -> int:
    n = 0
    while any(k.startswith(f'{root}.{n}.') for k in backbone):
        n += 1
    return n


def _block_indices(backbone: Mapping, pattern: str) -> List[int]:
    return sorted({int(m.group(1)) for k in backbone for m in [re.match(pattern, k)] if m})


def _out_norm_indices(backbone: Mapping, name: str = 'norm') -> Tuple[int, ...]:
    return tuple(sorted(int(m.group(1)) for k in backbone for m in [re.fullmatch(rf'{name}(\d+)\.weight', k)] if m))


def detect_mask(backbone: Mapping[str, torch.Tensor]) -> str:
    """PPMA/RMT: 'rmt' (fixed decay buffers), 'shared' (one decay direction), 'none' (no decays) or 'polyline'
    (two learned directions; a 'v2h' model has the same weights, pass its mask yourself)."""
    if any(k.endswith('Relpos.decay') for k in backbone):
        return 'rmt'
    rows = {v.shape[0] for k, v in backbone.items() if k.endswith('path_embed.dt_linear.weight')}
    if not rows:
        return 'none'
    return 'shared' if rows == {1} else 'polyline'


def inspect_ppma(backbone: Mapping[str, torch.Tensor]) -> dict:
    """PPMA/RMT settings visible in shapes: embed_dims, depths, num_heads, mlp_ratios, layer_scales, and
    ``variant`` ('PPMA' | 'RMT'), ``mask`` (:func:`detect_mask`), ``out_norms`` (``outnorm{i}``). The
    attention type per stage is not visible in weights."""
    if 'patch_embed.proj.9.weight' not in backbone:
        raise CheckpointMismatchError('not a PPMA/RMT backbone: no patch_embed.proj.9.weight; keys start with '
                                      f'{sorted(backbone)[:5]}')
    depths = []
    for s in range(_stage_count(backbone, 'layers')):
        blocks = _block_indices(backbone, rf'layers\.{s}\.blocks\.(\d+)\.')
        depths.append(blocks[-1] + 1 if blocks else 0)
    dims, heads, mlps, scales = [], [], [], []
    for s in range(len(depths)):
        p = f'layers.{s}.blocks.0.'
        dims.append(backbone[p + 'retention.q_proj.weight'].shape[0])
        heads.append(dims[-1] // backbone[f'layers.{s}.Relpos.angle'].shape[0])
        mlps.append(backbone[p + 'ffn.fc1.weight'].shape[0] / dims[-1])
        scales.append(p + 'gamma_1' in backbone)
    mlps = [int(m) if float(m).is_integer() else m for m in mlps]
    mask = detect_mask(backbone)
    return dict(embed_dims=dims, depths=depths, num_heads=heads, mlp_ratios=mlps, layer_scales=scales,
                variant='RMT' if mask == 'rmt' else 'PPMA', mask=mask,
                out_norms=_out_norm_indices(backbone, 'outnorm'))


def inspect_mlla(backbone: Mapping[str, torch.Tensor]) -> dict:
    """The settings visible in an MLLA backbone state dict's shapes (num_heads is not: the named archs use head
    dim 32): embed_dims, depths, mlp_ratio, and the dense output norms ``out_norms`` (``norm{i}``)."""
    if 'patch_embed.conv1.conv.weight' not in backbone:
        raise CheckpointMismatchError('not an MLLA backbone: no patch_embed.conv1.conv.weight; keys start with '
                                      f'{sorted(backbone)[:5]}')
    dims, depths = [], []
    for s in range(_stage_count(backbone, 'layers')):
        blocks = _block_indices(backbone, rf'layers\.{s}\.blocks\.(\d+)\.')
        depths.append(blocks[-1] + 1 if blocks else 0)
        key = f'layers.{s}.blocks.0.norm1.weight'
        if key not in backbone:
            raise CheckpointMismatchError(f'MLLA backbone: stage {s} has no {key}')
        dims.append(backbone[key].shape[0])
    ratio = backbone['layers.0.blocks.0.mlp.fc1.weight'].shape[0] / dims[0]
    return dict(embed_dims=dims, depths=depths, mlp_ratio=ratio, out_norms=_out_norm_indices(backbone))


def inspect_vminet(backbone: Mapping[str, torch.Tensor]) -> dict:
    """The settings visible in a VMINet backbone state dict: embed_dims, depths, mlp_ratios, stem_channels,
    kernel_size, the name of the blocks' 7x7 ConvBN (``block_conv``: 'dwconv', or 'conv' as the release revision
    7c2632c), ``proj_norm`` (``g.bn`` present), the stage-0 token table side ``base_size`` and the dense output
    norms (``norm{i}``: 'BN', ``outnorm{i}``: 'LN')."""
    if 'stem.0.conv.weight' not in backbone:
        raise CheckpointMismatchError('not a VMINet backbone: no stem.0.conv.weight; keys start with '
                                      f'{sorted(backbone)[:5]}')
    conv = 'conv' if any(VMINET_OLD_CONV.match(k) for k in backbone) else 'dwconv'
    dims, depths = [], []
    for s in range(_stage_count(backbone, 'stages')):
        key = f'stages.{s}.0.conv.weight'
        if key not in backbone:
            raise CheckpointMismatchError(f'VMINet backbone: stage {s} has no downsample {key}')
        dims.append(backbone[key].shape[0])
        blocks = _block_indices(backbone, rf'stages\.{s}\.(\d+)\.')
        depths.append(blocks[-1] if blocks else 0)
    first = 'stages.0.1.'
    if first + 'f1.conv.weight' not in backbone:
        raise CheckpointMismatchError(f'VMINet backbone: no {first}f1.conv.weight')
    table = backbone[first + 'sum.weight'].shape[-1] if first + 'sum.weight' in backbone else 0
    bn, ln = _out_norm_indices(backbone, 'norm'), _out_norm_indices(backbone, 'outnorm')
    return dict(
        embed_dims=dims,
        depths=depths,
        mlp_ratios=[backbone[f'stages.{s}.1.f1.conv.weight'].shape[0] // d if f'stages.{s}.1.f1.conv.weight' in
                    backbone else None for s, d in enumerate(dims)],
        stem_channels=backbone['stem.0.conv.weight'].shape[0],
        kernel_size=backbone[f'{first}{conv}.conv.weight'].shape[-1] if f'{first}{conv}.conv.weight' in backbone
        else None,
        block_conv=conv,
        proj_norm=any(k.endswith('.g.bn.weight') for k in backbone),
        base_size=math.isqrt(table),
        out_norms=bn or ln,
        out_norm_type='BN' if bn else ('LN' if ln else None))


INSPECT = {'PPMA': inspect_ppma, 'MLLA': inspect_mlla, 'VMINet': inspect_vminet}
#: settings in the arch tables that the weights do not show, with the releases' values
IMPLIED = {'PPMA': {}, 'MLLA': {}, 'VMINet': {'stem_channels': 32, 'kernel_size': 7}}


def match_arch(family: str, measured: dict) -> str:
    """The canonical arch name whose table entry equals the measured settings (from ``INSPECT[family]``)."""
    zoo = ZOOS[family]
    for name in ARCH_NAMES[family]:
        settings = dict(zoo[name], **IMPLIED[family])
        if all(settings[k] == measured[k] for k in settings if k in measured):
            return name
    shown = ', '.join(f'{k}={v}' for k, v in measured.items() if k in zoo[ARCH_NAMES[family][0]])
    hint = ('pass arch=dict(...) with attn_types (converter --arch-json)' if family == 'PPMA' else
            'pass a config whose model matches (converter --config)')
    table = 'arch in ARCH_ZOO' if family == 'PPMA' else 'named arch'
    raise CheckpointMismatchError(f'{family} backbone ({shown}) matches no {table} '
                                  f'({", ".join(ARCH_NAMES[family])}); {hint}')


# ---------------------------------------------------------------- reference models
def build_reference_backbone(family: str, arch: Union[str, dict], **kwargs) -> torch.nn.Module:
    """The family's backbone (``family`` 'PPMA', 'RMT', 'MLLA' or 'VMINet') from its arch table, on the meta
    device (shapes only), for key/shape checks."""
    cls = {'PPMA': PPMA, 'RMT': RMT, 'MLLA': MLLA, 'VMINet': VMINet}[family]
    with torch.device('meta'):
        return cls(arch, **kwargs)


def build_model_from_config(config: Union[str, Path], backbone_overrides: Optional[dict] = None,
                            backbone_only: bool = False, device: Union[str, torch.device] = 'meta'):
    """The config's mmpretrain model (or only its backbone), with ``backbone_overrides`` applied, built with
    mmpretrain's registry on ``device`` ('meta': shapes only, no memory)."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS

    model_cfg = copy.deepcopy(Config.fromfile(str(config)).model)
    model_cfg['backbone'].update(backbone_overrides or {})
    model_cfg.pop('train_cfg', None)  # batch augments: no state, only a log line
    with DefaultScope.overwrite_default_scope('mmpretrain'), torch.device(device):
        return MODELS.build(model_cfg['backbone'] if backbone_only else model_cfg)


@functools.lru_cache(maxsize=None)
def _config_shapes(config: str, overrides: Tuple[Tuple[str, object], ...], backbone_only: bool) -> dict:
    model = build_model_from_config(config, dict(overrides), backbone_only)
    return {k: torch.empty(v.shape, device='meta') for k, v in model.state_dict().items()}


def config_reference_state(config: Union[str, Path], backbone_overrides: Optional[dict] = None,
                           backbone_only: bool = False) -> Dict[str, torch.Tensor]:
    """Keys -> meta tensors of the model built from ``config`` (cached per config and overrides)."""
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (backbone_overrides or {}).items()))
    return dict(_config_shapes(str(config), items, backbone_only))


def _prefixed(state: Mapping[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    return {f'{prefix}{k}': v for k, v in state.items()}


# ---------------------------------------------------------------- release configs
def default_config(family: str, arch: str, revision: Optional[str] = None, variant: Optional[str] = None) -> str:
    """The repository config for a converted classifier, relative to the mmppma repository root:
    ``configs/<family>_<arch>_8xb128_in1k.py``, or ``configs/vminet_<arch>_release-<revision>_in1k.py``."""
    if revision:
        return f'configs/vminet_{arch}_release-{revision}_in1k.py'
    name = (variant or family).lower()
    return f'configs/{name}_{arch[0] if family == "PPMA" else arch}_8xb128_in1k.py'


def vminet_revision(measured: dict, downstream: bool) -> Optional[str]:
    """The release revision of a VMINet state dict's block layout (``inspect_vminet``): 7c2632c (``conv``, no
    ``g.bn``), 6b11d4a (``dwconv``, ``g.bn``; for a classification state), None (a downstream state in
    mmppma's ``dwconv`` layout: its options are not visible in the keys). Any other mix is an error."""
    old = measured['block_conv'] == 'conv'
    if old != (not measured['proj_norm']) and (old or not downstream):
        raise CheckpointMismatchError(
            f"VMINet blocks named {'conv' if old else 'dwconv'} {'with' if measured['proj_norm'] else 'without'} "
            f"g.bn: neither release revision's layout (6b11d4a: dwconv with g.bn; 7c2632c: conv without)")
    if old:
        return '7c2632c'
    return None if downstream else '6b11d4a'


def check_config_options(config: Union[str, Path], revision: str) -> None:
    """The config's backbone must have the VMINet release revision's options (:data:`RELEASE_REVISIONS`)."""
    from mmengine.config import Config
    backbone = Config.fromfile(str(config)).model.backbone
    defaults = inspect.signature(VMINet.__init__).parameters
    wrong = {k: v for k, v in RELEASE_REVISIONS[revision].items() if backbone.get(k, defaults[k].default) != v}
    if wrong:
        raise CheckpointMismatchError(
            f'{config}: model.backbone has ' + ', '.join(f'{k}={backbone.get(k, defaults[k].default)!r}' for k in wrong)
            + f'; the release revision {revision} needs ' + ', '.join(f'{k}={v!r}' for k, v in wrong.items())
            + ' (configs/vminet_<arch>_release-' + revision + '_in1k.py has them)')


def with_release_record(state: Dict[str, torch.Tensor], record: dict) -> 'OrderedDict[str, torch.Tensor]':
    """``state`` as an OrderedDict whose load metadata (``_metadata``, kept by torch.save / torch.load and by
    mmengine's ``load_checkpoint``) holds ``record`` for a VMINet at the root and under ``backbone``."""
    out = OrderedDict(state)
    out._metadata = OrderedDict((prefix, {RELEASE_RECORD: dict(record)}) for prefix in ('', 'backbone'))
    return out


def mlla_rope_rotations(height: int, width: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The MLLA classification release's ``attn.rope.rotations`` buffer for an (H, W) token grid and ``dim``
    channels: (H, W, dim / 2, 2) holding (cos, sin) of each channel pair's angle, the tables of
    :func:`~mmppma.models.layers.mlla.mlla_rope_tables` (one angle per pair)."""
    sin, cos = mlla_rope_tables(height, width, dim, base=base)
    return torch.stack([cos[..., 0::2], sin[..., 0::2]], dim=-1)


# ---------------------------------------------------------------- per-family mappings
def _map_backbone(family: str, backbone: dict, measured: dict, downstream: bool, info: dict) -> dict:
    """Release backbone keys -> mmppma's; records dropped buffers, notes, overrides and the VMINet revision."""
    notes, overrides = info['notes'], info['backbone_overrides']
    if family == 'MLLA':
        out = {}
        for k, v in backbone.items():
            if k.endswith(ROPE_SUFFIX):
                stage, dims = int(k.split('.')[1]), measured['embed_dims']
                if v.dim() != 4 or tuple(v.shape[-2:]) != (dims[stage] // 2, 2):
                    raise CheckpointMismatchError(f'{k}: RoPE table of shape {tuple(v.shape)}, expected (H, W, '
                                                  f'{dims[stage] // 2}, 2) for stage {stage} (dims {dims[stage]})')
                info['dropped'].append(k)
            else:
                out[k] = v
        if info['dropped']:
            notes.append(f'{len(info["dropped"])} release RoPE buffers (*{ROPE_SUFFIX}) dropped: mmppma computes RoPE '
                         f'per input size')
        return out
    if family == 'VMINet':
        revision = vminet_revision(measured, downstream)
        if measured['block_conv'] == 'conv':
            backbone = {VMINET_OLD_CONV.sub(r'\1dwconv.', k): v for k, v in backbone.items()}
            notes.append("blocks' conv.* renamed dwconv.*")
        if revision is None:
            notes.append('a backbone.-prefixed state in mmppma\'s layout: no release revision, its mask is '
                         'not visible in the weights')
            if not measured['proj_norm']:
                overrides['proj_norm'] = False
        if measured['base_size'] and measured['base_size'] != 56:
            overrides['img_size'] = measured['base_size'] * 4
        info['release'] = dict(revision=revision, **RELEASE_REVISIONS[revision]) if revision else None
        info['revision'] = revision
    return backbone


def _map_head(family: str, rest: Mapping[str, torch.Tensor], last: int) -> Tuple[dict, dict]:
    """A classification release's non-backbone keys -> (keys for the backbone, head keys)."""
    to_backbone, head = {}, {}
    for k, v in rest.items():
        if family == 'PPMA':
            prefix = next((p for p in PPMA_HEAD_MAP if k.startswith(p)), None)
            if prefix is None:
                raise CheckpointMismatchError(
                    f'unexpected key {k!r} outside backbone and head (proj, norm, head); all such keys: '
                    f'{sorted(k for k in rest if not k.startswith(tuple(PPMA_HEAD_MAP)))}')
            head[PPMA_HEAD_MAP[prefix] + k[len(prefix):]] = v
        elif k.startswith('norm.'):
            to_backbone[f'backbone.norm{last}.{k[len("norm."):]}'] = v
        elif k.startswith('head.'):
            head[f'head.fc.{k[len("head."):]}'] = v
        else:
            head[k] = v  # not the release's: reported as unexpected by the check
    return to_backbone, head


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


def _check_classifier_head(family: str, head: dict, backbone_dims: int, info: dict) -> Dict[str, torch.Tensor]:
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


def _check_against_config(family: str, out: dict, head: dict, config, info: dict, measured: dict,
                          downstream: bool, backbone_only: bool) -> None:
    """The converted state against the model of a given mmpretrain config (classification) or its backbone
    with the checkpoint's output norms (downstream)."""
    if info['release']:
        check_config_options(config, info['release']['revision'])
    overrides, arch, last = info['backbone_overrides'], info['arch'], len(measured['depths']) - 1
    if downstream:
        if family == 'VMINet':
            dense = dict(out_indices=measured['out_norms'] or tuple(range(last + 1)),
                         out_norm=measured['out_norm_type'])
        else:
            dense = dict(out_indices=measured['out_norms'] or (last, ), out_norm=bool(measured['out_norms']))
        ref = config_reference_state(config, dict(overrides, **dense), backbone_only=True)
        check_state_against(out, _prefixed(ref, 'backbone.'), f'{family} backbone ({arch}, {dense})')
        return
    ref = config_reference_state(config, overrides)
    if backbone_only:
        check_state_against(out, {k: v for k, v in ref.items() if k.startswith('backbone.')},
                            f'{family} backbone ({arch}) of {config}')
        return
    if 'head.fc.weight' not in head:
        raise CheckpointMismatchError('classification checkpoint without head (no head.weight); convert with '
                                      'backbone_only=True (--backbone-only)')
    num_classes = head['head.fc.weight'].shape[0]
    if 'head.fc.weight' in ref and ref['head.fc.weight'].shape[0] != num_classes:
        ref['head.fc.weight'] = torch.empty(num_classes, ref['head.fc.weight'].shape[1], device='meta')
        ref['head.fc.bias'] = torch.empty(num_classes, device='meta')
        info['notes'].append(f'{num_classes} classes: set model.head.num_classes={num_classes}')
    check_state_against({**out, **head}, ref, f'{family}-{arch} classifier of {config}')
    info['num_classes'] = num_classes


# ---------------------------------------------------------------- the API
def release_to_mmppma(state: Mapping[str, torch.Tensor],
                      family: str,
                      backbone_only: bool = False,
                      arch: Optional[Union[str, dict]] = None,
                      config: Optional[Union[str, Path]] = None,
                      check: bool = True) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Convert a release state dict (classification, or ``backbone.``-prefixed downstream) of ``family``
    ('PPMA' / 'RMT', 'MLLA', 'VMINet') to mmppma keys.

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
    the record revision, mask, proj_norm; None for a downstream state in mmppma's layout). A VMINet
    release state comes back carrying the record (:func:`with_release_record`).
    """
    family = check_family(family)
    downstream, backbone, rest = split_state(family, state)
    if not backbone:
        article = 'an' if family == 'MLLA' else 'a'
        raise CheckpointMismatchError(f'not {article} {family} backbone: no {"backbone." if downstream else ""}'
                                      f'{"* / ".join(BACKBONE_ROOTS[family])}* keys; keys start with '
                                      f'{sorted(state)[:5]}')
    measured = INSPECT[family](backbone)
    if isinstance(arch, str):
        arch = canonical_arch(family, arch)
    elif arch is None:
        try:
            arch = match_arch(family, measured)
        except CheckpointMismatchError:
            if check and config is None:
                raise
    last = len(measured['depths']) - 1
    info = dict(family=measured.get('variant', family), arch=arch, downstream=downstream, backbone_overrides={},
                dropped=[], passthrough=[], out_indices=measured['out_norms'], notes=[], revision=None, release=None)
    if family == 'PPMA':
        info['mask'] = measured['mask']
    backbone = _map_backbone(family, backbone, measured, downstream, info)
    release = info['release']
    out = _prefixed(backbone, 'backbone.')
    skip_head = downstream or (backbone_only and family == 'PPMA')  # PPMA's head has no backbone keys
    to_backbone, head = ({}, {}) if skip_head else _map_head(family, rest, last)
    out.update(to_backbone)
    if config is not None:
        info['config'] = str(config)
    elif isinstance(arch, str) and (family != 'PPMA' or measured['mask'] in ('polyline', 'rmt')):
        info['config'] = default_config(family, arch, info['revision'], info['family'])
    else:
        info['config'] = None
    if check and config is not None:
        _check_against_config(family, out, head, config, info, measured, downstream, backbone_only)
    elif check:
        ref = _reference_backbone_state(family, arch, measured, info['backbone_overrides'], downstream, release)
        what = f'{info["family"]} backbone ({arch})' if family == 'PPMA' else \
            f'{family} backbone ({arch}{", dense" if downstream else ""})'
        if family == 'PPMA':  # keys as in the release
            check_state_against(backbone, ref, what)
        elif downstream or backbone_only:
            check_state_against(out, _prefixed(ref, 'backbone.'), what)
        if not downstream and not backbone_only:
            last_dims = measured['embed_dims'][-1]
            ref_head = _check_classifier_head(family, head, last_dims, info)
            if family == 'PPMA':
                check_state_against(head, ref_head, 'PPMAClsHead')
            else:
                check_state_against({**out, **head}, {**_prefixed(ref, 'backbone.'), **ref_head},
                                    f'{family}-{arch} classifier')
    if not backbone_only:
        if downstream:
            info['passthrough'] = sorted(rest)
            out.update(rest)
        else:
            out.update(head)
    return (with_release_record(out, release) if release else out), info


def mmppma_to_release(state: Mapping[str, torch.Tensor],
                      family: str,
                      downstream: bool = False,
                      img_size: int = 224,
                      revision: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """Inverse of :func:`release_to_mmppma` (classification, or downstream with ``downstream=True``).

    MLLA: the RoPE buffers are regenerated (:func:`mlla_rope_rotations`) for ``img_size`` (the releases use
    224). VMINet: ``revision='7c2632c'`` writes that revision's block names (``conv`` for ``dwconv``); the
    default is the revision the state records (:func:`with_release_record`), else '6b11d4a'.
    """
    family = check_family(family)
    if family == 'PPMA':
        inverse = {v: k for k, v in PPMA_HEAD_MAP.items()}
        out = {}
        for k, v in state.items():
            if k.startswith('backbone.') and not downstream:
                out[k[len('backbone.'):]] = v
                continue
            prefix = None if downstream else next((p for p in inverse if k.startswith(p)), None)
            out[inverse[prefix] + k[len(prefix):] if prefix else k] = v
        return out
    backbone = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    others = {k: v for k, v in state.items() if not k.startswith('backbone.')}
    if family == 'MLLA':
        stages = _stage_count(backbone, 'layers')
        for s in range(stages):
            dim = backbone[f'layers.{s}.blocks.0.norm1.weight'].shape[0]
            side = img_size // 4 // 2**s
            table = mlla_rope_rotations(side, side, dim)
            for b in _block_indices(backbone, rf'layers\.{s}\.blocks\.(\d+)\.'):
                backbone[f'layers.{s}.blocks.{b}{ROPE_SUFFIX}'] = table
    else:
        stages = _stage_count(backbone, 'stages')
        if revision is None:
            record = (getattr(state, '_metadata', None) or {}).get('backbone', {}).get(RELEASE_RECORD)
            revision = record['revision'] if record else '6b11d4a'
        if revision == '7c2632c':
            backbone = {VMINET_NEW_CONV.sub(r'\1conv.', k): v for k, v in backbone.items()}
        elif revision != '6b11d4a':
            raise ValueError(f"revision={revision!r}; choose '6b11d4a' or '7c2632c'")
    if downstream:
        return {**_prefixed(backbone, 'backbone.'), **others}
    out = {}
    final = f'norm{stages - 1}.'
    for k, v in backbone.items():
        out['norm.' + k[len(final):] if k.startswith(final) else k] = v
    for k, v in others.items():
        out['head.' + k[len('head.fc.'):] if k.startswith('head.fc.') else k] = v
    return out

