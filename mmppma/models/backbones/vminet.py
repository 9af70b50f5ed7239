"""VMINet backbone (Vision Mamba Inspired Separable Self-Attention; docs/method.md §10),
registered once for mmpretrain, mmdet and mmseg.

Image (B, in_channels, H, W) -> stem (3x3 stride-2 ConvBN, 32 channels, ReLU6) -> four stages, each a 3x3
stride-2 ConvBN downsample then VMI-SA blocks (:class:`~mmppma.models.layers.vminet.VMISABlock`) -> per
``out_indices`` the stage output, normalized (``outnorm{i}`` / ``norm{i}``) when ``out_norm``, NCHW at
strides 4..32.

From the release (github.com/yws-wxs/VMINet, ``vminet.py``): the stem, blocks, downsampling, widths
``base_dim * 2^i``, depths 2-2-18-2 for every size, expansion r and the classifier (BatchNorm2d over the last
map, global average pool, Linear). Parameter counts with the 1000-class classifier (``out_norm='BN'`` on the
last stage + Linear): Ti 2,036,938, XS 7,440,370, S 13,347,442, B 28,387,138 (release 2.04/7.44/13.35/28.39 M).
FLOPs at 224 x 224 (:func:`mmppma.models.utils.count_flops`, mmengine's counter, multiply-add = 1): Ti 0.350,
XS 1.258, S 2.301, B 4.781 G; the paper says 0.3 / 1.4 / 2.3 / 4.8. S and B agree; XS's 1.4 does not follow
from the release's XS (XS and S differ only in r, and S agrees), and Ti's 0.3 only by rounding down.

Module names follow the release (``stem.0``, ``stages.{i}.0`` the downsample, ``stages.{i}.{j+1}`` block j), so
a release classification state dict loads with identity keys, plus ``norm`` -> ``backbone.norm3`` and
``head`` -> ``head.fc`` for mmpretrain's ImageClassifier (configs/vminet_*_in1k.py).

Two release revisions differ in the block; both are selectable:

* ``proj_norm``: BatchNorm after the output projection ``g`` (revision 6b11d4a, whose counts are the figures
  above; default) or none (revision 7c2632c: 2,032,426 / 7,431,346 / 13,338,418 / 28,369,090).
* ``context_mask``: 'tril' (default), the lower-triangular mask matrix of the paper's matrix form (Eq. 10,
  Table 4: the XS result 78.6 is the mask model, 76.5 without), as revision 7c2632c applies it, or 'none'
  (revision 6b11d4a's plain learned weighted sum).

Any input size (our choice; the release only runs at 224 x 224): each block's context-vector weights are a
table fixed to the stage's token grid at ``img_size`` (56/28/14/7 at 224, the release's ``nn.Linear(S*S, 1)``).
At another size the table is resized bilinearly and scaled by trained / actual token count
(:class:`~mmppma.models.layers.vminet.TokenWeights`), so odd sizes, 1-pixel-wide late stages and batch 1 work
and the table is used as trained at the trained size. The 'tril' mask is defined on raster token indices at
any size.

Dense outputs (our choice; the release publishes no dense-prediction code): a per-output norm, 'LN' (channel
LayerNorm, eps 1e-6, as mmdet/mmseg's ConvNeXt/Swin) by default or 'BN' (BatchNorm2d, the release's
classification norm: ``norm3`` is the release's ``norm``).
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.registry import register_model

from ..layers.vminet import CONTEXT_MASKS, ConvBN, VMIStage, stage_sizes
from .base import StagedBackbone, check_choice, resolve_arch_settings

_DEPTHS = [2, 2, 18, 2]  # the release: every size has 24 blocks, as Vim's 24 Mamba blocks


def _size(base_dim: int, mlp_ratio: int) -> dict:
    return dict(
        embed_dims=[base_dim * 2**i for i in range(4)], depths=list(_DEPTHS), mlp_ratios=[mlp_ratio] * 4)


#: The one architecture table (release ``vminet_{Ti,XS,S,B}``: base_dim, mlp_ratio; paper Table 1: C, k).
ARCH_ZOO: Dict[str, dict] = {
    **dict.fromkeys(['ti', 'tiny'], _size(24, 2)),
    **dict.fromkeys(['xs', 'xsmall'], _size(48, 2)),
    **dict.fromkeys(['s', 'small'], _size(48, 4)),
    **dict.fromkeys(['b', 'base'], _size(96, 2)),
}

REQUIRED_KEYS = ('embed_dims', 'depths', 'mlp_ratios')
OPTIONAL_KEYS = ('stem_channels', 'kernel_size')
DEFAULTS = dict(stem_channels=32, kernel_size=7)
OUT_NORMS = ('LN', 'BN')


def resolve_arch(arch: Union[str, dict]) -> dict:
    """A named arch ('ti'/'tiny', 'xs'/'xsmall', 's'/'small', 'b'/'base', any case) or a custom dict -> a
    full, checked settings dict (a copy). Raises ``ValueError``/``TypeError`` naming the valid choices."""
    arch = {**DEFAULTS, **resolve_arch_settings(arch, ARCH_ZOO, 'VMINet', REQUIRED_KEYS, OPTIONAL_KEYS)}
    if arch['kernel_size'] % 2 == 0:
        raise ValueError(f'custom VMINet arch dict: kernel_size must be odd; got {arch["kernel_size"]}')
    return arch


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2).contiguous()


@register_model
class VMINet(StagedBackbone):
    """VMINet (Vision Mamba Inspired Separable Self-Attention network), for classification and dense prediction.

    Args:
        arch: 'ti' | 'xs' | 's' | 'b' (or 'tiny' | 'xsmall' | 'small' | 'base'), or a dict with keys
            embed_dims, depths, mlp_ratios (per stage) and optionally stem_channels (32), kernel_size (7).
        in_channels: image channels.
        img_size: the (pre)training image size; fixes the size of the context weight tables (224 -> 56, 28,
            14, 7 tokens). Other input sizes resize the tables (see the module docstring).
        context_mask: 'tril' (paper Eq. 10, default) or 'none'.
        proj_norm: BatchNorm after each block's output projection (release revision 6b11d4a; default True).
        drop_path_rate: stochastic depth, linear from 0 to this over all blocks.
        out_indices: stages whose outputs are returned (negative counts from the end).
        out_norm: per-output norm: 'LN' (``outnorm{i}``, channel LayerNorm, eps 1e-6; also ``True``), 'BN'
            (``norm{i}``, BatchNorm2d: the release classifier's norm), or None / False.
        frozen_stages: -1 none; 0 the stem; k >= 1 the stem and stages 0..k-1 (with their output norms). Frozen
            parts stay in eval mode with ``requires_grad=False``, also after ``train()``.
        norm_eval: keep every BatchNorm in eval mode during training (frozen statistics).
        with_cp: gradient checkpointing per block (``use_reentrant=False``). BatchNorm statistics inside a
            checkpointed block are updated again on recomputation, as in mmcv's ResNet ``with_cp``.
        init_cfg: mmengine init config, e.g. ``dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.
            Without one the release init applies at construction (Linear-style context weights trunc_normal
            .02, BatchNorm 1 / 0, ``stack`` 1, convs PyTorch default).
        pretrained: mmseg's deprecated spelling of ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``
            (a path or URL; warns). A model-zoo URI of another architecture (``open-mmlab://``, ``torchvision://``,
            ``mmcls://``) is an error that says how to give weights through ``init_cfg``.

    Outputs: tuple of (B, C_i, ceil(H / 2^(i+2)), ceil(W / 2^(i+2))) for i in out_indices.
    """
    arch_zoo = ARCH_ZOO
    stem_name = 'stem'
    stages_name = 'stages'

    def __init__(self,
                 arch: Union[str, dict] = 'xs',
                 in_channels: int = 3,
                 img_size: Union[int, Sequence[int]] = 224,
                 context_mask: str = 'tril',
                 proj_norm: bool = True,
                 drop_path_rate: float = 0.0,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 out_norm: Union[str, bool, None] = 'LN',
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg: Optional[Union[dict, List[dict]]] = None,
                 pretrained: Optional[str] = None) -> None:
        super().__init__(init_cfg=init_cfg, pretrained=pretrained)
        check_choice('context_mask', context_mask, CONTEXT_MASKS)
        self.out_norm = self._check_out_norm(out_norm)
        self.arch_settings = resolve_arch(arch)
        s = self.arch_settings
        self._init_common(in_channels, s['depths'], out_indices, frozen_stages, norm_eval)
        self.embed_dims: List[int] = s['embed_dims']
        self.context_mask, self.proj_norm = context_mask, proj_norm
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)

        stem_channels = s['stem_channels']
        self.stem = nn.Sequential(ConvBN(in_channels, stem_channels, 3, stride=2), nn.ReLU6())
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths), device='cpu').tolist()
        sizes = stage_sizes(self.img_size, self.num_stages)
        self.stages = nn.ModuleList()
        for i in range(self.num_stages):
            first = sum(self.depths[:i])
            self.stages.append(
                VMIStage(
                    in_channels=self.embed_dims[i - 1] if i else stem_channels,
                    dim=self.embed_dims[i],
                    depth=self.depths[i],
                    mlp_ratio=s['mlp_ratios'][i],
                    base_size=sizes[i],
                    context_mask=context_mask,
                    proj_norm=proj_norm,
                    kernel_size=s['kernel_size'],
                    drop_paths=dpr[first:first + self.depths[i]],
                    with_cp=with_cp))
        if self.out_norm is not None:
            for i in self.out_indices:
                norm = (nn.BatchNorm2d(self.embed_dims[i]) if self.out_norm == 'BN' else ChannelLayerNorm(
                    self.embed_dims[i], eps=1e-6))
                self.add_module(self.out_norm_name(i), norm)
        self._freeze_stages()

    def out_norm_name(self, i: int) -> str:
        """``norm{i}`` (BatchNorm) or ``outnorm{i}`` (LayerNorm): different names for different layers, so a
        classification checkpoint's ``norm3`` never loads into a dense backbone's LayerNorm."""
        return f'norm{i}' if self.out_norm == 'BN' else f'outnorm{i}'

    @staticmethod
    def _check_out_norm(out_norm: Union[str, bool, None]) -> Optional[str]:
        if out_norm is True:
            return 'LN'
        if out_norm is None or out_norm is False:
            return None
        if isinstance(out_norm, str) and out_norm.upper() in OUT_NORMS:
            return out_norm.upper()
        raise ValueError(f'out_norm={out_norm!r}; choose one of {", ".join(map(repr, OUT_NORMS))}, True (= \'LN\') '
                         f'or None / False')

    def out_norm_module(self, i: int) -> Optional[nn.Module]:
        return getattr(self, self.out_norm_name(i)) if self.out_norm is not None else None

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """x: (B, in_channels, H, W), any H, W >= 1 -> tuple of NCHW features, one per ``out_indices``."""
        self._check_input(x)
        x = self.stem(x)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.out_indices:
                out = getattr(self, self.out_norm_name(i))(x) if self.out_norm is not None else x
                outs.append(out)
        return tuple(outs)

    def _stage_block_name(self, parts: List[str]) -> Optional[Tuple[int, int]]:
        """Block b of stage s (``stages.s.{b+1}``): 1 + sum(depths[:s]) + b; a stage's downsample
        (``stages.s.0``) goes with its first block."""
        if parts[0] != 'stages' or len(parts) <= 2:
            return None
        stage, index = int(parts[1]), int(parts[2])
        return stage, 1 + sum(self.depths[:stage]) + max(index - 1, 0)
