"""The PPMA family (PPMA and its RMT baseline, one release layout): the release's checkpoint format (layout:
docs/method.md §8, docs/checkpoints.md), as data for :func:`~mmppma.models.backbones.release.from_release`, and the
family's spec (:mod:`.family`).

The backbone keeps the release's module names, so its key map is the identity; the classifier head's
``proj``, ``norm``, ``head`` are :class:`~mmppma.models.heads.PPMAClsHead`'s ``head.{proj,norm,fc}``.
"""
import sys
from typing import Dict, Mapping, Tuple

import torch

from .family import FamilySpec, Variant, register_family
from .ppma import PPMA, RMT
from .release import CheckpointMismatchError, block_indices, out_norm_indices, stage_count

FAMILY = 'PPMA'
ROOTS = ('patch_embed.', 'layers.', 'outnorm')
#: canonical (config file) arch names, in detection order; no setting is implied beyond the shapes
ARCH_NAMES = ('tiny', 'small', 'base')
IMPLIED: Dict[str, object] = {}
#: the head's keys are not the backbone's, so a backbone-only conversion leaves the head out
HEAD_IN_BACKBONE = False
HEAD_MAP = {'proj.': 'head.proj.', 'norm.': 'head.norm.', 'head.': 'head.fc.'}


def detect_mask(backbone: Mapping[str, torch.Tensor]) -> str:
    """The ``mask`` a backbone state dict has: 'rmt' (fixed decay buffers), 'shared' (one decay direction),
    'none' (no decays) or 'polyline' (two learned directions; the ``form`` is not visible in weights)."""
    if any(k.endswith('Relpos.decay') for k in backbone):
        return 'rmt'
    rows = {v.shape[0] for k, v in backbone.items() if k.endswith('path_embed.dt_linear.weight')}
    if not rows:
        return 'none'
    return 'shared' if rows == {1} else 'polyline'


def measure(backbone: Mapping[str, torch.Tensor]) -> dict:
    """PPMA/RMT settings visible in shapes: embed_dims, depths, num_heads, mlp_ratios, layer_scales, and
    ``variant`` ('PPMA' | 'RMT'), ``mask`` (:func:`detect_mask`), ``out_norms`` (``outnorm{i}``) and the
    backbone's ``out_norm`` they need. The attention type per stage is not visible in weights."""
    if 'patch_embed.proj.9.weight' not in backbone:
        raise CheckpointMismatchError('not a PPMA/RMT backbone: no patch_embed.proj.9.weight; keys start with '
                                      f'{sorted(backbone)[:5]}')
    depths = []
    for s in range(stage_count(backbone, 'layers')):
        blocks = block_indices(backbone, rf'layers\.{s}\.blocks\.(\d+)\.')
        depths.append(blocks[-1] + 1 if blocks else 0)
    dims, heads, mlps, scales = [], [], [], []
    for s in range(len(depths)):
        p = f'layers.{s}.blocks.0.'
        dims.append(backbone[p + 'retention.q_proj.weight'].shape[0])
        heads.append(dims[-1] // backbone[f'layers.{s}.Relpos.angle'].shape[0])
        mlps.append(backbone[p + 'ffn.fc1.weight'].shape[0] / dims[-1])
        scales.append(p + 'gamma_1' in backbone)
    mlps = [int(m) if float(m).is_integer() else m for m in mlps]
    mask, out_norms = detect_mask(backbone), out_norm_indices(backbone, 'outnorm')
    return dict(embed_dims=dims, depths=depths, num_heads=heads, mlp_ratios=mlps, layer_scales=scales,
                variant='RMT' if mask == 'rmt' else 'PPMA', mask=mask, out_norms=out_norms, out_norm=bool(out_norms))


def map_backbone(backbone: dict, measured: dict, downstream: bool, info: dict) -> dict:
    """The identity: the backbone's module names are the release's."""
    return backbone


def map_head(rest: Mapping[str, torch.Tensor], last: int) -> Tuple[dict, dict]:
    """A classification release's non-backbone keys -> ({}, PPMAClsHead keys)."""
    head = {}
    for k, v in rest.items():
        prefix = next((p for p in HEAD_MAP if k.startswith(p)), None)
        if prefix is None:
            raise CheckpointMismatchError(
                f'unexpected key {k!r} outside backbone and head (proj, norm, head); all such keys: '
                f'{sorted(k for k in rest if not k.startswith(tuple(HEAD_MAP)))}')
        head[HEAD_MAP[prefix] + k[len(prefix):]] = v
    return {}, head


def release_only(state: Mapping[str, torch.Tensor]) -> bool:
    """No key is the release's alone: without ``head.weight`` a state is not recognised as a release."""
    return False


def to_release(state: Mapping[str, torch.Tensor], downstream: bool = False) -> Dict[str, torch.Tensor]:
    """mmppma keys -> the release's (classification, or downstream with ``downstream=True``)."""
    inverse = {v: k for k, v in HEAD_MAP.items()}
    out = {}
    for k, v in state.items():
        if k.startswith('backbone.') and not downstream:
            out[k[len('backbone.'):]] = v
            continue
        prefix = None if downstream else next((p for p in inverse if k.startswith(p)), None)
        out[inverse[prefix] + k[len(prefix):] if prefix else k] = v
    return out


PAPER, CODE = 'arXiv:2506.15940', 'https://github.com/zhongchenzhao/PPMA'


def weight_options(conversion) -> dict:
    """The learned mask the decays' shapes show (RMT: none, its mask is fixed)."""
    return {} if conversion.measured['variant'] == 'RMT' else dict(mask=conversion.measured['mask'])


SPEC = register_family(FamilySpec(
    release=sys.modules[__name__],
    variants=(
        Variant('PPMA', PPMA, metafile='ppma', paper=PAPER, code=CODE, op='ppma_attention',
                kernels=dict(criss_cross='cc', whole='whole'), release_model='PPMAViT_', baseline='RMT'),
        Variant('RMT', RMT, metafile='rmt', paper='arXiv:2309.11523', code='https://github.com/qhfan/RMT',
                no_weights='the RMT release (github.com/qhfan/RMT) links its ImageNet weights only as a Baidu '
                'Netdisk share, and the PPMA release publishes no RMT file: there is no direct download',
                op='ppma_attention', kernels=dict(criss_cross='rmt_cc', whole='manhattan'), release_model='RMT_'),
    ),
    sizes=dict(tiny='t', small='s', base='b'),
    head='ppma',
    stem='patch_embed.proj.0',
    classifier_options=dict(out_norm=False),
    dense_options=dict(out_norm=True),
    weight_options=weight_options,
    # the configs are for the polyline mask (and RMT's); the shared and no-mask ablations have none
    has_config=lambda info: info['mask'] in ('polyline', 'rmt'),
    custom_arch='attn_types',  # the attention type per stage is not visible in the weights
    kernel_models={f'{key}_{arch[0]}': (name, arch) for name, key in (('PPMA', 'ppma'), ('RMT', 'rmt'))
                   for arch in ('tiny', 'small', 'base')},
))
