"""VMINet's pieces (Vision Mamba Inspired Separable Self-Attention), on NCHW feature maps.

Attribute names (``conv``/``bn`` inside :class:`~mmppma.models.layers.conv.ConvBN`, ``dwconv``, ``f1``,
``f2``, ``sum``, ``g``, ``stack``; a stage is ``[downsample, block, block, ...]``) follow the release's module
layout (github.com/yws-wxs/VMINet, ``vminet.py``), so its state dicts map onto ours with identity keys inside the
stages.
"""
import math
from typing import Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .block import DropPath, run_blocks
from .conv import ConvBN

#: VMINet's ``context_mask``, the context vector's mask: 'none' (plain per-token weighted sum) or 'tril' (the
#: release's lower-triangular mask on the (tokens x channels) matrix: channel c sums only over raster tokens n >= c).
VMINET_CONTEXT_MASKS = ('none', 'tril')


class TokenWeights(nn.Module):
    """The learned per-token weights of the context vector, a table for one feature size (``base_size``).

    ``weight``: (1, S_h * S_w), the release's ``nn.Linear(S*S, 1, bias=False)`` weight (same key).

    The release fixes the table to the 224 x 224 token grid. At another (h, w) the table is resized
    bilinearly to (h, w) and scaled by ``S_h * S_w / (h * w)``, so that the weights' total (and the context
    vector's magnitude) stays what training saw: the sum over tokens becomes a resolution-independent
    weighted average times the trained token count. At the trained size it is the table itself.
    """

    def __init__(self, base_size: Sequence[int]) -> None:
        super().__init__()
        self.base_size = (int(base_size[0]), int(base_size[1]))
        self.weight = nn.Parameter(torch.empty(1, self.base_size[0] * self.base_size[1]))
        nn.init.trunc_normal_(self.weight, std=0.02)

    def resized(self, h: int, w: int) -> torch.Tensor:
        """(h * w, 1) column of token weights for an (h, w) map, raster order."""
        if (h, w) == self.base_size:
            return self.weight.t()
        table = self.weight.view(1, 1, *self.base_size)
        table = F.interpolate(table, size=(h, w), mode='bilinear', align_corners=False)
        # the tensor divided by the token count (an int): a Python float made from h * w would be a value that
        # torch.compile specialises on, recompiling at every new size
        return (table * (self.base_size[0] * self.base_size[1]) / (h * w)).reshape(h * w, 1)

    def extra_repr(self) -> str:
        return f'base_size={self.base_size}'


class VMISABlock(nn.Module):
    """One VMI-SA block (paper Fig. 1 / Eq. 10, release ``Block``), residual, NCHW in and out.

    ``y = relu6(f1(u)) * f2(u)`` with ``u = BN(dwconv7x7(x))`` and f1, f2 1x1 convs C -> r C;
    context vector ``s = sum_n w_n mask(y)_n`` (B, rC, 1, 1), learned token weights w (:class:`TokenWeights`);
    ``x + drop_path(BN(g(relu6(stack_0 s + stack_1 y))))`` with g a 1x1 conv rC -> C.

    Args:
        dim: channels C.
        mlp_ratio: expansion r of the two branches.
        base_size: the token grid the weight table is trained at (stage size at 224 x 224).
        context_mask: 'none' or 'tril' (see :data:`VMINET_CONTEXT_MASKS`).
        proj_norm: BatchNorm after ``g`` (release revision 6b11d4a: yes; 7c2632c: no).
        kernel_size: depthwise kernel (7).
        drop_path: stochastic depth probability of the residual branch.
    """

    def __init__(self,
                 dim: int,
                 mlp_ratio: int,
                 base_size: Sequence[int],
                 context_mask: str = 'tril',
                 proj_norm: bool = True,
                 kernel_size: int = 7,
                 drop_path: float = 0.0) -> None:
        super().__init__()
        hidden = int(mlp_ratio * dim)
        self.context_mask = context_mask
        self.dwconv = ConvBN(dim, dim, kernel_size, groups=dim)
        self.f1 = ConvBN(dim, hidden, norm_name=None)
        self.f2 = ConvBN(dim, hidden, norm_name=None)
        self.sum = TokenWeights(base_size)
        self.g = ConvBN(hidden, dim, norm_name='bn' if proj_norm else None)
        self.stack = nn.Parameter(torch.ones(2))
        self.act = nn.ReLU6()
        self.drop_path = DropPath(drop_path)

    def context(self, y: torch.Tensor) -> torch.Tensor:
        """y: (B, C, H, W) -> context vector (B, C, 1, 1)."""
        b, c, h, w = y.shape
        tokens = y.reshape(b, c, h * w)
        if self.context_mask == 'tril':
            # release: tril of the (N, C) matrix keeps (n, c) with c <= n, i.e. triu of our (C, N) view
            tokens = tokens.triu()
        weights = self.sum.resized(h, w).to(tokens.dtype)
        return torch.matmul(tokens, weights).unsqueeze(-1)  # (B, C, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.dwconv(x)
        y = self.act(self.f1(u)) * self.f2(u)
        mixed = self.stack[0] * self.context(y) + self.stack[1] * y  # the context broadcasts over H, W
        return x + self.drop_path(self.g(self.act(mixed)))


class VMIStage(nn.Sequential):
    """``[0]`` the downsample (the release's stride-2 3x3 ConvBN, no activation), ``[1:]`` the VMI-SA blocks.

    forward: (B, C_in, H, W) -> (B, C, ceil(H/2), ceil(W/2)); with ``with_cp`` each block runs under
    ``torch.utils.checkpoint`` (non-reentrant) while grad mode is on.
    """

    def __init__(self, downsample: nn.Module, blocks: Iterable[VMISABlock], with_cp: bool = False) -> None:
        super().__init__(downsample, *blocks)
        self.with_cp = with_cp

    @property
    def downsample(self) -> nn.Module:
        return self[0]

    @property
    def blocks(self) -> Sequence[VMISABlock]:
        return list(self)[1:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_blocks(self.blocks, self[0](x), with_cp=self.with_cp)


def stage_sizes(img_size: Sequence[int], num_stages: int) -> list:
    """Token grid of each stage for an (H, W) image: stem and downsamples are 3x3 stride-2 convs
    (224 -> 56, 28, 14, 7)."""
    h, w = img_size
    sizes = []
    h, w = math.ceil(h / 2), math.ceil(w / 2)  # stem
    for _ in range(num_stages):
        h, w = math.ceil(h / 2), math.ceil(w / 2)
        sizes.append((h, w))
    return sizes
