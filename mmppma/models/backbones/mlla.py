"""MLLA backbone (Mamba-Like Linear Attention, NeurIPS 2024) and its PPMLA variant, registered once for
mmpretrain, mmdet and mmseg.

Image (B, in_channels, H, W) -> conv stem (stride 4) -> stages of MLLA blocks on channels-last tokens, each
but the last followed by a stride-2 inverted-residual downsample -> per ``out_indices`` the stage output
before its downsample, LayerNorm'ed (``norm{i}``, eps 1e-5) when ``out_norm``, as NCHW.

The structure is the public release's (LeapLabTHU/MLLA, ``models/mlla.py``; layers in
:mod:`mmppma.models.layers.mlla`) with the same module names, so its checkpoints map key for key:
a classification checkpoint's ``norm`` is ``norm3`` here (with ``out_indices=(3, )``) and its ``head`` is
mmpretrain's ``LinearClsHead.fc``; its dense-prediction checkpoints (``norm0``-``norm3``) load as they are.
The release's ``attn.rope.rotations`` buffers are not kept (RoPE is computed per input size).

``mask='polyline'`` (PPMLA) multiplies every block's linear attention by the polyline path mask (PPMA paper, Appendix
A.7), O(N); see :class:`~mmppma.models.layers.mlla.MLLAAttention`.
"""
from typing import Dict, Tuple, Union

import torch
import torch.nn as nn

from mmppma.registry import register_model

from ..layers.mlla import MLLA_MASKS, MLLABlock, MLLADownsample, MLLAStage, MLLAStem
from .base import StagedBackbone, check_choice, resolve_arch_settings

_TINY = dict(embed_dims=[64, 128, 256, 512], depths=[2, 4, 8, 4], num_heads=[2, 4, 8, 16], mlp_ratio=4.0)
_SMALL = dict(embed_dims=[64, 128, 256, 512], depths=[3, 6, 21, 6], num_heads=[2, 4, 8, 16], mlp_ratio=4.0)
_BASE = dict(embed_dims=[96, 192, 384, 768], depths=[3, 6, 21, 6], num_heads=[3, 6, 12, 24], mlp_ratio=4.0)

#: The MLLA architecture table (the release's cfgs/mlla_{t,s,b}.yaml; head dim 32 everywhere).
MLLA_ARCH_ZOO: Dict[str, dict] = {
    **dict.fromkeys(['t', 'tiny'], _TINY),
    **dict.fromkeys(['s', 'small'], _SMALL),
    **dict.fromkeys(['b', 'base'], _BASE),
}

REQUIRED_KEYS = ('embed_dims', 'depths', 'num_heads')
OPTIONAL_KEYS = ('mlp_ratio', )


def resolve_mlla_arch(arch: Union[str, dict]) -> dict:
    """A named arch (``'tiny' | 'small' | 'base'`` or ``t | s | b``) or a custom dict -> a full, checked
    settings dict (a copy). Raises ``ValueError``/``TypeError`` naming the valid choices."""
    named = isinstance(arch, str)
    arch = resolve_arch_settings(arch, MLLA_ARCH_ZOO, 'MLLA', REQUIRED_KEYS, OPTIONAL_KEYS,
                                 defaults=lambda _: dict(mlp_ratio=4.0))
    if named:
        return arch
    for i, (dims, heads) in enumerate(zip(arch['embed_dims'], arch['num_heads'])):
        if dims % heads or dims % 4:
            raise ValueError(f'custom MLLA arch dict: stage {i} embed_dims={dims} must be divisible by '
                             f'num_heads={heads} and by 4 (RoPE turns channel pairs by row and by column)')
    return arch


@register_model
class MLLA(StagedBackbone):
    """MLLA backbone (Han et al., NeurIPS 2024), for classification and dense prediction; optionally PPMLA.

    Args:
        arch: 'tiny' | 'small' | 'base' (or 't' | 's' | 'b'), or a dict with keys embed_dims, depths,
            num_heads (per stage) and optionally mlp_ratio (4).
        in_channels: image channels.
        mask: 'none' (default, MLLA: the release's normalized linear attention) or 'polyline' (PPMLA: the same
            attention times the polyline path mask with learned per-head decays, normalized by the masked mass).
        impl: the ops' implementation for PPMLA ('auto' | 'torch' | 'triton' | 'reference').
        out_norm: LayerNorm (eps 1e-5) each returned output (``norm{i}``), as the release's dense backbones;
            for classification use ``out_indices=(3, )``: ``norm3`` is the release's final ``norm``.
        **kwargs: the keywords every backbone shares (keyword only), documented in :class:`StagedBackbone`:
            drop_path_rate, out_indices, frozen_stages, norm_eval, with_cp, init_cfg, pretrained. Without
            ``init_cfg`` the release init applies (Linear trunc_normal .02 / bias 0, LayerNorm 1 / 0).

    Outputs: tuple of (B, C_i, ceil(H / 2^(i+2)), ceil(W / 2^(i+2))) for i in out_indices, for any H, W >= 1.
    """
    arch_zoo = MLLA_ARCH_ZOO

    def __init__(self, arch: Union[str, dict] = 'tiny', in_channels: int = 3, mask: str = 'none',
                 impl: str = 'auto', *, out_norm: bool = True, **kwargs) -> None:
        check_choice('mask', mask, MLLA_MASKS)
        super().__init__(resolve_mlla_arch(arch), in_channels, **kwargs)
        s = self.arch_settings
        self.mask, self.impl, self.out_norm = mask, impl, out_norm

        self.patch_embed = MLLAStem(in_channels, self.embed_dims[0])
        self.layers = nn.ModuleList()
        for i, (dims, heads) in enumerate(zip(self.embed_dims, s['num_heads'])):
            blocks = [MLLABlock(dims, heads, s['mlp_ratio'], mask, impl, p) for p in self.drop_paths[i]]
            downsample = MLLADownsample(dims, self.embed_dims[i + 1]) if i < self.num_stages - 1 else None
            self.layers.append(MLLAStage(blocks, downsample, self.with_cp))
        if out_norm:
            self._add_out_norms(lambda i: nn.LayerNorm(self.embed_dims[i]))
        self._release_init()
        self._freeze_stages()

    def out_norm_name(self, i: int) -> str:
        return f'norm{i}'

    def _release_init(self) -> None:
        """Every Linear trunc_normal(std .02) and bias 0; LayerNorm weight 1, bias 0. Convs, BatchNorms and
        PPMLA's decay parameters keep their own initialization (PyTorch default; docs/method.md §1)."""
        self._trunc_normal_init()

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W), any H, W >= 1 -> tuple of NCHW features, one per ``out_indices``."""
        return tuple(self.forward_stages(x, self.out_indices))

    def extra_repr(self) -> str:
        return f'mask={self.mask!r}, out_indices={self.out_indices}'
