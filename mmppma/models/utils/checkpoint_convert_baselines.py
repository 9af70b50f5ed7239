"""Official MLLA / VMINet release checkpoints <-> mmppma checkpoints (the baselines' counterpart of
:mod:`.checkpoint_convert`, which does PPMA / RMT).

mmppma's MLLA and VMINet backbones keep the releases' module names, so the backbone mapping is the identity
under a ``backbone.`` prefix, with these exceptions:

* MLLA (LeapLabTHU/MLLA): the persistent RoPE tables ``layers.*.blocks.*.attn.rope.rotations`` (fixed
  cos/sin buffers for the 224 x 224 grid) are dropped (mmppma computes RoPE per input size) and regenerated
  by the reverse mapping; the classifier's final ``norm`` is ``backbone.norm{last}`` (LayerNorm).
* VMINet (yws-wxs/VMINet): the classifier's final ``norm`` is ``backbone.norm{last}`` (BatchNorm2d). Both
  revisions of the release's ``vminet.py`` are read, told apart by their keys
  (:data:`~mmppma.models.backbones.vminet.RELEASE_REVISIONS`): 6b11d4a (blocks' ``dwconv``, ``g.bn``; no
  context mask) and 7c2632c (``conv``, renamed ``dwconv``; no ``g.bn``; the 'tril' mask). The converted state
  is checked against ``configs/vminet_<arch>_release-<revision>_in1k.py`` and carries the revision and its
  options (``RELEASE_RECORD`` in the state dict's load metadata), which the backbone checks on loading.
* both: the release ``head`` is mmpretrain's ``LinearClsHead`` ``head.fc``.

The release layouts converted: MLLA ``models/mlla.py`` of LeapLabTHU/MLLA at commit 5a17196 (with
``cfgs/mlla_{t,s,b}.yaml``); VMINet ``vminet.py`` of yws-wxs/VMINet at commits 6b11d4a and 7c2632c.

The converted classification state is checked key by key and shape by shape against the mmpretrain
ImageClassifier built (on the meta device) from the config (default: ``configs/mlla_<arch>_8xb128_in1k.py``,
``configs/vminet_<arch>_release-<revision>_in1k.py``) or a given one; a downstream (``backbone.``-prefixed)
state's backbone against the config's backbone with the output norms found in the checkpoint. Anything
missing, unexpected or mis-shaped raises :class:`~.checkpoint_convert.CheckpointMismatchError` listing the keys.
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

from ..backbones.mlla import MLLA_ARCH_ZOO
from ..backbones.vminet import ARCH_ZOO as VMINET_ARCH_ZOO
from ..backbones.vminet import RELEASE_RECORD, RELEASE_REVISIONS, VMINet
from .checkpoint_convert import CheckpointMismatchError, check_state_against, extract_state_dict

FAMILIES = ('MLLA', 'VMINet')
#: canonical (config file) arch names per family, in detection order
ARCH_NAMES = {'MLLA': ('t', 's', 'b'), 'VMINet': ('ti', 'xs', 's', 'b')}
ZOOS = {'MLLA': MLLA_ARCH_ZOO, 'VMINet': VMINET_ARCH_ZOO}
BACKBONE_ROOTS = {'MLLA': ('patch_embed.', 'layers.'), 'VMINet': ('stem.', 'stages.')}
CONFIG_DIR = Path(__file__).resolve().parents[3] / 'configs'
ROPE_SUFFIX = '.attn.rope.rotations'
VMINET_OLD_CONV = re.compile(r'^(stages\.\d+\.[1-9]\d*\.)conv\.')  # revision 7c2632c: block's 7x7 ConvBN
VMINET_NEW_CONV = re.compile(r'^(stages\.\d+\.[1-9]\d*\.)dwconv\.')


def check_family(family: str) -> str:
    for f in FAMILIES:
        if family.lower() == f.lower():
            return f
    raise ValueError(f'family={family!r}; choose one of {", ".join(FAMILIES)}')


def canonical_arch(family: str, arch: str) -> str:
    """'tiny' / 'T' / 't' ... -> the config name ('t' for MLLA, 'ti' for VMINet, ...)."""
    zoo = ZOOS[family]
    if arch.lower() not in zoo:
        raise ValueError(f'arch={arch!r} is not a {family} arch; choose one of {", ".join(sorted(zoo))}')
    return next(name for name in ARCH_NAMES[family] if zoo[name] == zoo[arch.lower()])


def extract_release_state(checkpoint: Mapping, key: Optional[str] = None) -> Tuple[Dict[str, torch.Tensor], str]:
    """:func:`~.checkpoint_convert.extract_state_dict`, also accepting a checkpoint that holds only
    ``state_dict_ema`` (the releases' training scripts' EMA copy); a ``module.`` (DDP) prefix on every key is
    removed."""
    try:
        state, where = extract_state_dict(checkpoint, key)
    except KeyError:
        if key is not None or not isinstance(checkpoint.get('state_dict_ema'), Mapping):
            raise
        state, where = dict(checkpoint['state_dict_ema']), 'state_dict_ema'
    if state and all(k.startswith('module.') for k in state):
        state = {k[len('module.'):]: v for k, v in state.items()}
    return state, where


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


def _stage_count(backbone: Mapping, root: str) -> int:
    n = 0
    while any(k.startswith(f'{root}.{n}.') for k in backbone):
        n += 1
    return n


def _block_indices(backbone: Mapping, pattern: str) -> List[int]:
    return sorted({int(m.group(1)) for k in backbone for m in [re.match(pattern, k)] if m})


def _out_norm_indices(backbone: Mapping, name: str = 'norm') -> Tuple[int, ...]:
    return tuple(sorted(int(m.group(1)) for k in backbone for m in [re.fullmatch(rf'{name}(\d+)\.weight', k)] if m))


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
    old = any(VMINET_OLD_CONV.match(k) for k in backbone)
    conv = 'conv' if old else 'dwconv'
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


def match_arch(family: str, measured: dict) -> str:
    """The canonical arch name whose table entry equals the measured settings."""
    zoo = ZOOS[family]
    for name in ARCH_NAMES[family]:
        settings = dict(zoo[name], **({'stem_channels': 32, 'kernel_size': 7} if family == 'VMINet' else {}))
        if all(settings[k] == measured[k] for k in settings if k in measured):
            return name
    shown = ', '.join(f'{k}={v}' for k, v in measured.items() if k in zoo[ARCH_NAMES[family][0]])
    raise CheckpointMismatchError(f'{family} backbone ({shown}) matches no named arch '
                                  f'({", ".join(ARCH_NAMES[family])}); pass a config whose model matches '
                                  f'(converter --config)')


def default_config(family: str, arch: str) -> Path:
    path = CONFIG_DIR / f'{family.lower()}_{arch}_8xb128_in1k.py'
    if not path.exists():
        raise FileNotFoundError(f'{path} not found (mmppma is not run from a checkout?); pass the classification '
                                f'config (converter --config)')
    return path


def release_config(arch: str, revision: str) -> Path:
    """``configs/vminet_<arch>_release-<revision>_in1k.py``: the classifier config of a VMINet release revision."""
    path = CONFIG_DIR / f'vminet_{arch}_release-{revision}_in1k.py'
    if not path.exists():
        raise FileNotFoundError(f'{path} not found (mmppma is not run from a checkout?); pass the classification '
                                f'config (converter --config) with {release_options_text(revision)}')
    return path


def release_options_text(revision: str) -> str:
    return ', '.join(f'{k}={v!r}' for k, v in RELEASE_REVISIONS[revision].items())


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
    """The config's backbone must have the revision's options (:data:`RELEASE_REVISIONS`)."""
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
def _reference_shapes(config: str, overrides: Tuple[Tuple[str, object], ...], backbone_only: bool) -> dict:
    model = build_model_from_config(config, dict(overrides), backbone_only)
    return {k: torch.empty(v.shape, device='meta') for k, v in model.state_dict().items()}


def reference_state(config: Union[str, Path], backbone_overrides: Optional[dict] = None,
                    backbone_only: bool = False) -> Dict[str, torch.Tensor]:
    """Keys -> meta tensors of the model built from ``config`` (cached per config and overrides)."""
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (backbone_overrides or {}).items()))
    return dict(_reference_shapes(str(config), items, backbone_only))


def _map_mlla_backbone(backbone: Mapping[str, torch.Tensor], dims: List[int], dropped: List[str]) -> dict:
    out = {}
    for k, v in backbone.items():
        if k.endswith(ROPE_SUFFIX):
            stage = int(k.split('.')[1])
            if v.dim() != 4 or tuple(v.shape[-2:]) != (dims[stage] // 2, 2):
                raise CheckpointMismatchError(f'{k}: RoPE table of shape {tuple(v.shape)}, expected (H, W, '
                                              f'{dims[stage] // 2}, 2) for stage {stage} (dims {dims[stage]})')
            dropped.append(k)
            continue
        out[k] = v
    return out


def release_to_mmppma(state: Mapping[str, torch.Tensor],
                      family: str,
                      backbone_only: bool = False,
                      arch: Optional[str] = None,
                      config: Optional[Union[str, Path]] = None,
                      check: bool = True) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Convert an MLLA / VMINet release state dict (classification or ``backbone.``-prefixed downstream) to
    mmppma keys.

    Returns (state dict, info). Classification: ``backbone.*`` (the release's final ``norm`` as
    ``backbone.norm{last}``) + ``head.fc.*``, complete for the ImageClassifier of ``config`` (default
    ``configs/<family>_<arch>_8xb128_in1k.py``; ``arch`` detected from shapes unless given). Downstream: the
    backbone under ``backbone.`` (its ``norm{i}`` kept), the detector's / segmentor's own keys passed through
    unchecked unless ``backbone_only``. ``backbone_only``: only ``backbone.*`` keys (for
    ``init_cfg=dict(type='Pretrained', prefix='backbone.')``). ``info``: family, arch, config, downstream,
    backbone_overrides (settings the checkpoint needs that differ from the config's defaults), dropped
    (release buffers with no counterpart), passthrough keys, num_classes, notes, and for VMINet ``revision``
    and ``release`` (the record: revision, context_mask, proj_norm; None for a downstream state in mmppma's
    layout).

    VMINet: the default config is the revision's (:func:`release_config`); a given config must have the
    revision's options (:func:`check_config_options`). The returned state carries the record
    (:func:`with_release_record`).
    """
    family = check_family(family)
    downstream, backbone, rest = split_state(family, state)
    if not backbone:
        article = 'an' if family == 'MLLA' else 'a'
        raise CheckpointMismatchError(f'not {article} {family} backbone: no {"backbone." if downstream else ""}'
                                      f'{"* / ".join(BACKBONE_ROOTS[family])}* keys; keys start with '
                                      f'{sorted(state)[:5]}')
    measured = inspect_mlla(backbone) if family == 'MLLA' else inspect_vminet(backbone)
    if arch is not None:
        arch = canonical_arch(family, arch)
    else:
        try:
            arch = match_arch(family, measured)
        except CheckpointMismatchError:
            if check and config is None:
                raise
    last = len(measured['depths']) - 1
    overrides, notes, dropped, revision = {}, [], [], None
    if family == 'MLLA':
        backbone = _map_mlla_backbone(backbone, measured['embed_dims'], dropped)
        if dropped:
            notes.append(f'{len(dropped)} release RoPE buffers (*{ROPE_SUFFIX}) dropped: mmppma computes RoPE per '
                         f'input size')
    else:
        revision = vminet_revision(measured, downstream)
        if measured['block_conv'] == 'conv':
            backbone = {VMINET_OLD_CONV.sub(r'\1dwconv.', k): v for k, v in backbone.items()}
            notes.append("blocks' conv.* renamed dwconv.*")
        if revision is None:
            notes.append('a backbone.-prefixed state in mmppma\'s layout: no release revision, its context_mask is '
                         'not visible in the weights')
            if not measured['proj_norm']:
                overrides['proj_norm'] = False
        if measured['base_size'] and measured['base_size'] != 56:
            overrides['img_size'] = measured['base_size'] * 4
    release = dict(revision=revision, **RELEASE_REVISIONS[revision]) if family == 'VMINet' and revision else None
    info = dict(family=family, arch=arch, downstream=downstream, backbone_overrides=overrides, dropped=dropped,
                passthrough=[], out_indices=measured['out_norms'], notes=notes,
                revision=release['revision'] if release else None, release=release)

    out = {f'backbone.{k}': v for k, v in backbone.items()}
    head = {}
    if not downstream:
        for k, v in rest.items():
            if k.startswith('norm.'):
                out[f'backbone.norm{last}.{k[len("norm."):]}'] = v
            elif k.startswith('head.'):
                head[f'head.fc.{k[len("head."):]}'] = v
            else:
                head[k] = v  # not the release's: reported as unexpected by the check
    if check:
        if config is None:
            config = release_config(arch, release['revision']) if release else default_config(family, arch)
        elif release:
            check_config_options(config, release['revision'])
        info['config'] = str(config)
        if downstream:
            if family == 'MLLA':
                dense = dict(out_indices=measured['out_norms'] or (last, ), out_norm=bool(measured['out_norms']))
            else:
                dense = dict(out_indices=measured['out_norms'] or tuple(range(last + 1)),
                             out_norm=measured['out_norm_type'])
            ref = reference_state(config, dict(overrides, **dense), backbone_only=True)
            check_state_against(out, {f'backbone.{k}': v for k, v in ref.items()},
                                f'{family} backbone ({arch}, {dense})')
        else:
            ref = reference_state(config, overrides)
            if backbone_only:
                ref = {k: v for k, v in ref.items() if k.startswith('backbone.')}
                check_state_against(out, ref, f'{family} backbone ({arch}) of {config}')
            else:
                if 'head.fc.weight' not in head:
                    raise CheckpointMismatchError('classification checkpoint without head (no head.weight); convert '
                                                  'with backbone_only=True (--backbone-only)')
                num_classes = head['head.fc.weight'].shape[0]
                ref_classes = ref['head.fc.weight'].shape[0] if 'head.fc.weight' in ref else None
                if ref_classes is not None and ref_classes != num_classes:
                    ref['head.fc.weight'] = torch.empty(num_classes, ref['head.fc.weight'].shape[1], device='meta')
                    ref['head.fc.bias'] = torch.empty(num_classes, device='meta')
                    notes.append(f'{num_classes} classes: set model.head.num_classes={num_classes}')
                check_state_against({**out, **head}, ref, f'{family}-{arch} classifier of {config}')
                info['num_classes'] = num_classes
    if not backbone_only:
        if downstream:
            info['passthrough'] = sorted(rest)
            out.update(rest)
        else:
            out.update(head)
    return (with_release_record(out, release) if release else out), info


def mlla_rope_rotations(height: int, width: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The MLLA classification release's ``attn.rope.rotations`` buffer for an (H, W) token grid and ``dim``
    channels: (H, W, dim / 2, 2) holding (cos, sin) of each channel pair's angle; pairs 0 .. dim/4 - 1 turn with
    the row index, the others with the column index, at frequencies ``base^(-t / (dim / 4))`` (float32)."""
    quarter = dim // 4
    freqs = 1.0 / base**(torch.arange(quarter) / quarter)
    rows = torch.arange(height)[:, None, None] * freqs
    cols = torch.arange(width)[None, :, None] * freqs
    angles = torch.cat([rows.expand(height, width, quarter), cols.expand(height, width, quarter)], dim=-1)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


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
        return {**{f'backbone.{k}': v for k, v in backbone.items()}, **others}
    out = {}
    final = f'norm{stages - 1}.'
    for k, v in backbone.items():
        out['norm.' + k[len(final):] if k.startswith(final) else k] = v
    for k, v in others.items():
        out['head.' + k[len('head.fc.'):] if k.startswith('head.fc.') else k] = v
    return out
