"""Official PPMA / RMT release checkpoints <-> mmppma checkpoints (docs/method.md §8).

mmppma's backbone uses the release's module names, so the backbone mapping is the identity under a
``backbone.`` prefix; the release's top-level head ``proj``, ``norm``, ``head`` become ``head.proj``,
``head.norm``, ``head.fc`` (:class:`~mmppma.models.heads.PPMAClsHead`). Every converted key and shape is
checked against a model built from the detected arch: anything missing, unexpected or mis-shaped raises.
The release layout converted: zhongchenzhao/PPMA, ``classification/models/{PPMA,RMT}.py`` at commit 088b82d
(downstream: ``detection/ppma.py`` at d556292, ``segmentation/ppma.py`` at 088b82d).
"""
import re
from typing import Dict, List, Mapping, Optional, Tuple, Union

import torch

from ..backbones.ppma import ARCH_ZOO, PPMA, RMT, resolve_arch

STATE_KEYS = ('model', 'model_ema', 'models', 'state_dict')
HEAD_MAP = {'proj.': 'head.proj.', 'norm.': 'head.norm.', 'head.': 'head.fc.'}
BACKBONE_ROOTS = ('patch_embed.', 'layers.', 'outnorm')


class CheckpointMismatchError(ValueError):
    """A checkpoint whose keys or shapes do not match the model they are meant for."""


def extract_state_dict(checkpoint: Mapping, key: Optional[str] = None) -> Tuple[Dict[str, torch.Tensor], str]:
    """The release's state dict and where it was: ``key`` if given, else the first of
    ``model``, ``model_ema``, ``models``, ``state_dict`` present; a bare state dict is returned as is."""
    if key is not None:
        if key not in checkpoint:
            raise KeyError(f'checkpoint has no {key!r}; its top-level keys are {sorted(checkpoint)}')
        return dict(checkpoint[key]), key
    for k in STATE_KEYS:
        if k in checkpoint and isinstance(checkpoint[k], Mapping):
            return dict(checkpoint[k]), k
    if checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return dict(checkpoint), ''
    raise KeyError(f'no state dict found under {", ".join(STATE_KEYS)}; top-level keys are {sorted(checkpoint)}. '
                   f'Name the right one (converter --key).')


def split_backbone(state: Mapping[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """(backbone keys without any ``backbone.`` prefix, everything else)."""
    has_prefix = any(k.startswith('backbone.') for k in state)
    backbone, rest = {}, {}
    for k, v in state.items():
        if has_prefix:
            if k.startswith('backbone.'):
                backbone[k[len('backbone.'):]] = v
            else:
                rest[k] = v
        elif k.startswith(BACKBONE_ROOTS):
            backbone[k] = v
        else:
            rest[k] = v
    return backbone, rest


def detect_mask(backbone: Mapping[str, torch.Tensor]) -> str:
    """'rmt' (fixed decay buffers), 'shared' (one decay direction), 'none' (no decays) or 'polyline' (two
    learned directions; a 'v2h' model has the same weights, pass its mask yourself)."""
    if any(k.endswith('Relpos.decay') for k in backbone):
        return 'rmt'
    rows = {v.shape[0] for k, v in backbone.items() if k.endswith('path_embed.dt_linear.weight')}
    if not rows:
        return 'none'
    return 'shared' if rows == {1} else 'polyline'


def inspect_backbone(backbone: Mapping[str, torch.Tensor]) -> Tuple[str, dict, Tuple[int, ...]]:
    """(family 'PPMA' | 'RMT', the settings visible in shapes, outnorm indices) of a backbone state dict.

    Widths, depths, heads, mlp ratios and layer scales are read from shapes; the attention type per stage is
    not visible in weights.
    """
    if 'patch_embed.proj.9.weight' not in backbone:
        raise CheckpointMismatchError('not a PPMA/RMT backbone: no patch_embed.proj.9.weight; keys start with '
                                      f'{sorted(backbone)[:5]}')
    depths: List[int] = []
    while any(k.startswith(f'layers.{len(depths)}.') for k in backbone):
        s = len(depths)
        blocks = {int(m.group(1)) for k in backbone for m in [re.match(rf'layers\.{s}\.blocks\.(\d+)\.', k)] if m}
        depths.append(max(blocks) + 1 if blocks else 0)
    family = 'RMT' if any(k.endswith('Relpos.decay') for k in backbone) else 'PPMA'
    dims, heads, mlps, scales = [], [], [], []
    for s in range(len(depths)):
        p = f'layers.{s}.blocks.0.'
        dims.append(backbone[p + 'retention.q_proj.weight'].shape[0])
        heads.append(dims[-1] // backbone[f'layers.{s}.Relpos.angle'].shape[0])
        mlps.append(backbone[p + 'ffn.fc1.weight'].shape[0] / dims[-1])
        scales.append(p + 'gamma_1' in backbone)
    mlps = [int(m) if float(m).is_integer() else m for m in mlps]
    outnorms = tuple(sorted(int(k[len('outnorm'):].split('.')[0]) for k in backbone if k.startswith('outnorm')
                            and k.endswith('.weight')))
    measured = dict(embed_dims=dims, depths=depths, num_heads=heads, mlp_ratios=mlps, layer_scales=scales)
    return family, measured, outnorms


def match_arch(measured: dict) -> str:
    """The ARCH_ZOO name whose settings equal ``measured`` (from :func:`inspect_backbone`)."""
    for name in ('tiny', 'small', 'base'):
        if all(ARCH_ZOO[name][k] == v for k, v in measured.items()):
            return name
    raise CheckpointMismatchError(
        f'backbone ({", ".join(f"{k}={v}" for k, v in measured.items())}) matches no arch in ARCH_ZOO (tiny, small, '
        f'base); pass arch=dict(...) with attn_types (converter --arch-json)')


def build_reference_backbone(family: str, arch: Union[str, dict], out_indices: Tuple[int, ...],
                             mask: str = 'polyline') -> torch.nn.Module:
    """A backbone on the meta device (shapes only), for key/shape checks."""
    settings = resolve_arch(arch)
    with torch.device('meta'):
        out_norm = bool(out_indices)
        out_indices = out_indices or (len(settings['depths']) - 1, )
        if family == 'RMT':
            return RMT(settings, out_indices=out_indices, out_norm=out_norm)
        return PPMA(settings, mask=mask, out_indices=out_indices, out_norm=out_norm)


def check_state_against(state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], what: str) -> None:
    """Raise :class:`CheckpointMismatchError` listing missing, unexpected and mis-shaped keys."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}'
                    for k in set(state) & set(expected) if tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or shapes:
        raise CheckpointMismatchError(f'{what}: {len(missing)} missing keys {missing}, {len(unexpected)} unexpected '
                                      f'keys {unexpected}, {len(shapes)} shape mismatches {shapes}')


def official_to_mmppma(state: Mapping[str, torch.Tensor],
                       backbone_only: bool = False,
                       arch: Optional[Union[str, dict]] = None,
                       check: bool = True) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Convert a release state dict (classification or downstream) to mmppma keys.

    Returns (state dict, info). Classification: ``backbone.*`` + ``head.{proj,norm,fc}.*``, complete for an
    mmpretrain ImageClassifier with PPMA(out_indices=(3,), out_norm=False) and PPMAClsHead. Downstream
    (``backbone.``-prefixed): the backbone under ``backbone.``; with ``backbone_only=False`` the detector's /
    segmentor's own keys are passed through unchanged (they are upstream's, not checked here).
    ``backbone_only``: only ``backbone.*`` keys (for ``init_cfg=dict(type='Pretrained', prefix='backbone.')``).
    ``info``: family, arch, out_indices, head classes, passthrough keys.
    """
    downstream = any(k.startswith('backbone.') for k in state)
    backbone, rest = split_backbone(state)
    family, measured, outnorms = inspect_backbone(backbone)
    arch = arch if arch is not None else match_arch(measured)
    mask = detect_mask(backbone)
    info = dict(family=family, arch=arch, mask=mask, out_indices=outnorms, downstream=downstream, passthrough=[])
    if check:
        ref = build_reference_backbone(family, arch, outnorms, mask).state_dict()
        check_state_against(backbone, ref, f'{family} backbone ({arch})')
    out = {f'backbone.{k}': v for k, v in backbone.items()}
    if backbone_only:
        return out, info
    if downstream:
        info['passthrough'] = sorted(rest)
        out.update(rest)
        return out, info
    head = {}
    for k, v in rest.items():
        prefix = next((p for p in HEAD_MAP if k.startswith(p)), None)
        if prefix is None:
            raise CheckpointMismatchError(f'unexpected key {k!r} outside backbone and head (proj, norm, head); '
                                          f'all such keys: {sorted(k for k in rest if not k.startswith(tuple(HEAD_MAP)))}')
        head[HEAD_MAP[prefix] + k[len(prefix):]] = v
    if check:
        if 'head.fc.weight' not in head:
            raise CheckpointMismatchError('classification checkpoint without head (no head.weight); convert with '
                                          'backbone_only=True (--backbone-only)')
        num_classes, hidden = head['head.fc.weight'].shape
        in_channels = head['head.proj.weight'].shape[1] if 'head.proj.weight' in head else -1
        from ..heads import PPMAClsHead
        with torch.device('meta'):
            ref_head = PPMAClsHead(num_classes, in_channels, hidden, loss=torch.nn.Identity())
        check_state_against(head, {f'head.{k}': v for k, v in ref_head.state_dict().items()}, 'PPMAClsHead')
        info.update(num_classes=num_classes)
    out.update(head)
    return out, info


def mmppma_to_official(state: Mapping[str, torch.Tensor], downstream: bool = False) -> Dict[str, torch.Tensor]:
    """Inverse of :func:`official_to_mmppma` (classification, or downstream with ``downstream=True``)."""
    inverse = {v: k for k, v in HEAD_MAP.items()}
    out = {}
    for k, v in state.items():
        if k.startswith('backbone.') and not downstream:
            out[k[len('backbone.'):]] = v
            continue
        prefix = None if downstream else next((p for p in inverse if k.startswith(p)), None)
        out[inverse[prefix] + k[len(prefix):] if prefix else k] = v
    return out
