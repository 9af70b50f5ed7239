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

``attn='ppmla'`` multiplies every block's linear attention by the polyline path mask (PPMA paper, Appendix
A.7), O(N); see :class:`~mmppma.models.layers.mlla.MLLAAttention`.
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from mmppma.registry import register_model

from ..layers.mlla import MLLA_ATTNS, MLLAStage, MLLAStem
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
        attn: 'mlla' (default: the release's normalized linear attention) or 'ppmla' (the same attention
            times the polyline path mask with learned per-head decays, normalized by the masked mass).
        impl: the ops' implementation for PPMLA ('auto' | 'torch' | 'triton' | 'reference').
        drop_path_rate: stochastic depth, linear from 0 to this over all blocks.
        out_indices: stages whose outputs are returned (negative counts from the end).
        out_norm: LayerNorm (eps 1e-5) each returned output (``norm{i}``), as the release's dense backbones;
            for classification use ``out_indices=(3, )``: ``norm3`` is the release's final ``norm``.
        frozen_stages: -1 none; 0 the stem; k >= 1 the stem and stages 0..k-1 (with their downsample and
            norm). Frozen parts stay in eval mode with ``requires_grad=False``, also after ``train()``.
        norm_eval: keep every BatchNorm in eval mode during training.
        with_cp: gradient checkpointing per block (``use_reentrant=False``).
        init_cfg: mmengine init config, e.g. ``dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.
            Without one the release init applies (Linear trunc_normal .02 / bias 0, LayerNorm 1 / 0), already
            at construction.
        pretrained: mmseg's deprecated spelling of ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``
            (a path or URL; warns). A model-zoo URI of another architecture (``open-mmlab://``, ``torchvision://``,
            ``mmcls://``) is an error that says how to give weights through ``init_cfg``.

    Outputs: tuple of (B, C_i, ceil(H / 2^(i+2)), ceil(W / 2^(i+2))) for i in out_indices, for any H, W >= 1.
    """
    arch_zoo = MLLA_ARCH_ZOO

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 attn: str = 'mlla',
                 impl: str = 'auto',
                 drop_path_rate: float = 0.0,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 out_norm: bool = True,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg: Optional[Union[dict, List[dict]]] = None,
                 pretrained: Optional[str] = None) -> None:
        super().__init__(init_cfg=init_cfg, pretrained=pretrained)
        check_choice('attn', attn, MLLA_ATTNS)
        self.arch_settings = resolve_mlla_arch(arch)
        s = self.arch_settings
        self._init_common(in_channels, s['depths'], out_indices, frozen_stages, norm_eval)
        self.embed_dims: List[int] = s['embed_dims']
        self.attn, self.impl, self.out_norm = attn, impl, out_norm

        self.patch_embed = MLLAStem(in_channels, self.embed_dims[0])
        drop_paths = self.drop_path_rates(drop_path_rate)
        self.layers = nn.ModuleList()
        for i in range(self.num_stages):
            self.layers.append(
                MLLAStage(
                    embed_dims=self.embed_dims[i],
                    depth=self.depths[i],
                    num_heads=s['num_heads'][i],
                    mlp_ratio=s['mlp_ratio'],
                    attn=attn,
                    impl=impl,
                    drop_paths=tuple(drop_paths[i]),
                    out_channels=self.embed_dims[i + 1] if i < self.num_stages - 1 else None,
                    with_cp=with_cp))
        if out_norm:
            for i in self.out_indices:
                self.add_module(f'norm{i}', nn.LayerNorm(self.embed_dims[i]))
        self._release_init()
        self._freeze_stages()

    def out_norm_module(self, i: int) -> Optional[nn.Module]:
        return getattr(self, f'norm{i}', None)

    def _release_init(self) -> None:
        """Every Linear trunc_normal(std .02) and bias 0; LayerNorm weight 1, bias 0. Convs, BatchNorms and
        PPMLA's decay parameters keep their own initialization (PyTorch default; docs/method.md §1)."""
        self._trunc_normal_init()

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W), any H, W >= 1 -> tuple of NCHW features, one per ``out_indices``."""
        return self._forward_channels_last(x)

    def extra_repr(self) -> str:
        return f'attn={self.attn!r}, out_indices={self.out_indices}'
