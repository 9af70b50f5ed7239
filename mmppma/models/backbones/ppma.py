"""PPMA and RMT backbones (docs/method.md §6-7), registered once for mmpretrain, mmdet and mmseg.

Image (B, in_channels, H, W) -> conv stem (stride 4) -> stages of blocks on channels-last tokens, each but the
last followed by a stride-2 conv downsample -> per ``out_indices`` the stage output before its downsample,
LayerNorm'ed (eps 1e-5, ``outnorm{i}``) when ``out_norm``, as NCHW.

Module names follow the release's checkpoint layout (docs/method.md §8), so official weights load with an
identity key mapping (the family's release format and spec: :mod:`.ppma_spec`).
"""
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from mmppma.registry import register_model

from ..layers import ConvDownsample, ConvStem, PPMABlock, PPMAStage, RasterRoPE2D, check_variant
from .base import StagedBackbone, resolve_arch_settings

CC, WHOLE = 'criss_cross', 'whole'
_TINY = dict(embed_dims=[64, 128, 256, 512], depths=[2, 2, 8, 2], num_heads=[4, 4, 8, 16], mlp_ratios=[3, 3, 3, 3],
             attn_types=[CC, CC, WHOLE, WHOLE], heads_ranges=[4, 4, 6, 6],
             layer_scales=[False] * 4, layer_scale_init_value=1e-6)
_SMALL = dict(embed_dims=[64, 128, 256, 512], depths=[3, 4, 18, 4], num_heads=[4, 4, 8, 16], mlp_ratios=[4, 4, 3, 3],
              attn_types=[CC, CC, CC, WHOLE], heads_ranges=[4, 4, 6, 6],
              layer_scales=[False] * 4, layer_scale_init_value=1e-6)
_BASE = dict(embed_dims=[80, 160, 320, 512], depths=[4, 8, 25, 8], num_heads=[5, 5, 10, 16], mlp_ratios=[4, 4, 3, 3],
             attn_types=[CC, CC, CC, WHOLE], heads_ranges=[5, 5, 6, 6],
             layer_scales=[False, False, True, True], layer_scale_init_value=1e-6)

#: The one architecture table (docs/method.md §7). ``heads_ranges`` are RMT's fixed-decay ranges r (mask='rmt').
ARCH_ZOO: Dict[str, dict] = {
    **dict.fromkeys(['t', 'tiny'], _TINY),
    **dict.fromkeys(['s', 'small'], _SMALL),
    **dict.fromkeys(['b', 'base'], _BASE),
}

REQUIRED_KEYS = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'attn_types')
OPTIONAL_KEYS = ('layer_scales', 'layer_scale_init_value', 'heads_ranges')
PER_STAGE_KEYS = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios', 'attn_types', 'layer_scales',
                  'heads_ranges')


def _ppma_defaults(num_stages: int) -> dict:
    return dict(layer_scales=[False] * num_stages, layer_scale_init_value=1e-6,
                heads_ranges=[4 if i < 2 else 6 for i in range(num_stages)])


def resolve_arch(arch: Union[str, dict]) -> dict:
    """A named arch (``'tiny' | 'small' | 'base'`` or ``t | s | b``) or a custom dict -> a full, checked
    settings dict (a copy). Raises ``ValueError``/``TypeError`` naming the valid choices; the ``attn_types``
    are checked with the mask and form (:func:`~mmppma.models.layers.attention.check_variant`)."""
    named = isinstance(arch, str)
    arch = resolve_arch_settings(arch, ARCH_ZOO, 'PPMA', REQUIRED_KEYS, OPTIONAL_KEYS, PER_STAGE_KEYS,
                                 _ppma_defaults)
    if named:
        return arch
    odd = [(i, d, n) for i, (d, n) in enumerate(zip(arch['embed_dims'], arch['num_heads'])) if d % n or d // n % 2]
    if odd:
        i, dims, heads = odd[0]
        raise ValueError(f'custom PPMA arch dict: stage {i} embed_dims={dims} must be num_heads={heads} times '
                         f'an even head dimension (RoPE rotates channel pairs)')
    return arch


@register_model
class PPMA(StagedBackbone):
    """Polyline Path Masked Attention backbone (NeurIPS 2025), for classification and dense prediction.

    Args:
        arch: a named arch of :data:`ARCH_ZOO` ('tiny' | 'small' | 'base', or 't' | 's' | 'b') or a dict with
            keys embed_dims, depths, num_heads, mlp_ratios, attn_types (per stage 'criss_cross' | 'whole'), and
            optionally layer_scales (per stage bool), layer_scale_init_value, heads_ranges (RMT decay ranges).
        in_channels: image channels (3 for RGB).
        mask: the path mask's decays (paper Table 4): 'polyline' (learned, horizontal and vertical; default),
            'shared' (one learned decay for both directions), 'rmt' (fixed Manhattan decay), 'none'.
        form: the ops' ``form`` with a learned mask: 'release' (default; the checkpoints'), 'v2h' (the V2H path
            only, paper Table 4) or 'paper' (whole attention's Eq. 10; every stage's attn_type 'whole').
            Checked with ``mask`` and the ``attn_types`` here (:func:`~mmppma.models.layers.check_variant`).
        impl: attention implementation passed to :mod:`mmppma.ops` ('auto' | 'torch' | 'triton' | 'reference').
        out_norm: LayerNorm (eps 1e-5) each returned output (``outnorm{i}``; the release's dense backbones).
            Classification checkpoints have none: classification configs set False.
        **kwargs: the keywords every backbone shares (keyword only), documented in :class:`StagedBackbone`:
            drop_path_rate, out_indices, frozen_stages, norm_eval, with_cp, init_cfg, pretrained. Without
            ``init_cfg`` the release init applies (Linear trunc_normal .02 / bias 0, LayerNorm 1 / 0, decays per
            docs/method.md §1).

    Outputs: tuple of (B, C_i, ceil(H / 2^(i+2)), ceil(W / 2^(i+2))) for i in out_indices.
    """
    arch_zoo = ARCH_ZOO

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 mask: str = 'polyline',
                 form: str = 'release',
                 impl: str = 'auto',
                 *,
                 out_norm: bool = True,
                 **kwargs) -> None:
        super().__init__(resolve_arch(arch), in_channels, **kwargs)
        s = self.arch_settings
        check_variant(s['attn_types'], mask, form)
        self.mask, self.form, self.impl, self.out_norm = mask, form, impl, out_norm

        self.patch_embed = ConvStem(in_channels, self.embed_dims[0])
        self.layers = nn.ModuleList()
        for i, (dims, heads) in enumerate(zip(self.embed_dims, s['num_heads'])):
            layer_scale = s['layer_scale_init_value'] if s['layer_scales'][i] else None
            blocks = [
                PPMABlock(dims, heads, s['mlp_ratios'][i], s['attn_types'][i], mask, form, impl, drop_path,
                          layer_scale) for drop_path in self.drop_paths[i]
            ]
            # Only the fixed-decay (RMT) mask stores decays with the position tables.
            relpos = RasterRoPE2D(dims // heads, heads, s['heads_ranges'][i] if mask == 'rmt' else None)
            downsample = ConvDownsample(dims, self.embed_dims[i + 1]) if i < self.num_stages - 1 else None
            self.layers.append(PPMAStage(relpos, blocks, downsample, self.with_cp))
        if out_norm:
            self._add_out_norms(lambda i: nn.LayerNorm(self.embed_dims[i], eps=1e-5))
        self._release_init()
        self._freeze_stages()

    def _release_init(self) -> None:
        """Every Linear trunc_normal(std .02) and bias 0; LayerNorm weight 1, bias 0. Convs, BatchNorms and
        the decay parameters keep their own initialization (PyTorch default; docs/method.md §1)."""
        self._trunc_normal_init()

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W), any H, W >= 1 -> tuple of NCHW features, one per ``out_indices``."""
        return tuple(self.forward_stages(x, self.out_indices))

    def _stage_block_name(self, parts: List[str]) -> Optional[Tuple[int, int]]:
        """As :class:`StagedBackbone`, except that a stage's ``Relpos`` goes with its first block."""
        if parts[0] == self.stages_name and len(parts) > 2 and parts[2] == 'Relpos':
            stage = int(parts[1])
            return stage, 1 + sum(self.depths[:stage])
        return super()._stage_block_name(parts)


@register_model
class RMT(PPMA):
    """RMT baseline (Fan et al., CVPR 2024) in PPMA's macro architecture: fixed per-head decays
    ``log(1 - 2^(-2 - r*h/n))``, Manhattan mask in whole stages, rows-then-columns criss-cross elsewhere.
    Same as ``PPMA(mask='rmt')``; takes every PPMA argument but ``mask`` and ``form``.
    Each stage's ``Relpos`` holds the ``angle`` and ``decay`` buffers.
    """

    def __init__(self, arch: Union[str, dict] = 'tiny', in_channels: int = 3, impl: str = 'auto', *,
                 out_norm: bool = True, **kwargs) -> None:
        fixed = sorted({'mask', 'form'} & set(kwargs))
        if fixed:
            raise TypeError(f'RMT takes no {" or ".join(fixed)}: its mask is the fixed decay (PPMA(mask=\'rmt\')); '
                            f'for a learned mask use PPMA(mask=...)')
        super().__init__(arch, in_channels, 'rmt', impl=impl, out_norm=out_norm, **kwargs)
