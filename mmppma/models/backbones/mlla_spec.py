"""The MLLA family (MLLA and PPMLA, its attention times the polyline path mask): the MLLA release's checkpoint
format (LeapLabTHU/MLLA), as data for :func:`~mmppma.models.backbones.release.from_release`, and the family's spec
(:mod:`.family`).

The backbone keeps the release's module names; a classifier's ``norm`` is ``backbone.norm{last}`` and its
``head`` mmpretrain's ``LinearClsHead.fc``. The classification release's RoPE buffers
(``*.attn.rope.rotations``) are dropped: mmppma computes RoPE per input size (:func:`rope_rotations` writes
them back for the release).
"""
import sys
from typing import Dict, Mapping

import torch

from ..layers.mlla import mlla_rope_tables
from . import release
from .family import FamilySpec, Variant, register_family
from .mlla import MLLA
from .release import CheckpointMismatchError, block_indices, out_norm_indices, stage_count

FAMILY = 'MLLA'
ROOTS = ('patch_embed.', 'layers.')
ARCH_NAMES = ('t', 's', 'b')
IMPLIED: Dict[str, object] = {}
HEAD_IN_BACKBONE = True  # the release's final norm is the backbone's norm{last}
ROPE_SUFFIX = '.attn.rope.rotations'


def measure(backbone: Mapping[str, torch.Tensor]) -> dict:
    """The settings visible in an MLLA backbone state dict's shapes (num_heads is not: the named archs use head
    dim 32): embed_dims, depths, mlp_ratio, the dense output norms ``out_norms`` (``norm{i}``) and the backbone's
    ``out_norm`` they need."""
    if 'patch_embed.conv1.conv.weight' not in backbone:
        raise CheckpointMismatchError('not an MLLA backbone: no patch_embed.conv1.conv.weight; keys start with '
                                      f'{sorted(backbone)[:5]}')
    dims, depths = [], []
    for s in range(stage_count(backbone, 'layers')):
        blocks = block_indices(backbone, rf'layers\.{s}\.blocks\.(\d+)\.')
        depths.append(blocks[-1] + 1 if blocks else 0)
        key = f'layers.{s}.blocks.0.norm1.weight'
        if key not in backbone:
            raise CheckpointMismatchError(f'MLLA backbone: stage {s} has no {key}')
        dims.append(backbone[key].shape[0])
    ratio = backbone['layers.0.blocks.0.mlp.fc1.weight'].shape[0] / dims[0]
    out_norms = out_norm_indices(backbone)
    return dict(embed_dims=dims, depths=depths, mlp_ratio=ratio, out_norms=out_norms, out_norm=bool(out_norms))


def map_backbone(backbone: dict, measured: dict, downstream: bool, info: dict) -> dict:
    """The identity, less the RoPE buffers (shape-checked, named in ``info['dropped']``)."""
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
        info['notes'].append(f'{len(info["dropped"])} release RoPE buffers (*{ROPE_SUFFIX}) dropped: mmppma computes '
                             f'RoPE per input size')
    return out


map_head = release.linear_head


def release_only(state: Mapping[str, torch.Tensor]) -> bool:
    """The classification release's RoPE buffers."""
    return any(k.endswith(ROPE_SUFFIX) for k in state)


def rope_rotations(height: int, width: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The classification release's ``attn.rope.rotations`` buffer for an (H, W) token grid and ``dim``
    channels: (H, W, dim / 2, 2) holding (cos, sin) of each channel pair's angle, the tables of
    :func:`~mmppma.models.layers.mlla.mlla_rope_tables` (one angle per pair)."""
    sin, cos = mlla_rope_tables(height, width, dim, base=base)
    return torch.stack([cos[..., 0::2], sin[..., 0::2]], dim=-1)


def to_release(state: Mapping[str, torch.Tensor], downstream: bool = False,
               img_size: int = 224) -> Dict[str, torch.Tensor]:
    """mmppma keys -> the release's, the RoPE buffers regenerated for ``img_size`` (the releases use 224)."""
    backbone = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    others = {k: v for k, v in state.items() if not k.startswith('backbone.')}
    stages = stage_count(backbone, 'layers')
    for s in range(stages):
        dim = backbone[f'layers.{s}.blocks.0.norm1.weight'].shape[0]
        side = img_size // 4 // 2**s
        table = rope_rotations(side, side, dim)
        for b in block_indices(backbone, rf'layers\.{s}\.blocks\.(\d+)\.'):
            backbone[f'layers.{s}.blocks.{b}{ROPE_SUFFIX}'] = table
    if downstream:
        return {**release.prefixed(backbone, 'backbone.'), **others}
    return release.linear_head_to_release(backbone, others, stages)


SPEC = register_family(FamilySpec(
    release=sys.modules[__name__],
    variants=(
        Variant('MLLA', MLLA, metafile='mlla', paper='arXiv:2405.16605', code='https://github.com/LeapLabTHU/MLLA',
                op='ppma_linear_attention'),
        Variant('PPMLA', MLLA, options=dict(mask='polyline'), paper='arXiv:2506.15940',
                code='https://github.com/zhongchenzhao/PPMA',
                no_weights='no PPMLA weights are published (the PPMA release has none)', op='ppma_linear_attention',
                kernels='linear', baseline='MLLA'),
    ),
    sizes=dict(tiny='t', small='s', base='b'),
    head='linear',
    stem='patch_embed.conv1.conv',
    classifier_options=dict(out_norm=True),  # the release's final norm is norm3
    dense_options=dict(out_norm=True),
    # the kernel tools' labels of PPMLA's stages (MLLA, mask='none', launches no kernel)
    kernel_models=dict(mlla_t=('PPMLA', 'tiny'), mlla_b=('PPMLA', 'base')),
))
