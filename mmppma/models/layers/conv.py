"""Convolutional pieces of the PPMA/RMT macro architecture (docs/method.md §7), on channels-last tokens.

Attribute names (``conv``, ``proj``, ``reduction``, ``norm``) follow the release's checkpoint layout.
:class:`ConvBN` is the conv-BatchNorm-activation unit of MLLA's and VMINet's stems and downsamples.
"""
from typing import Optional

import torch
import torch.nn as nn

from .inplace import add_into


@torch.library.custom_op('mmppma::tokens_to_nchw', mutates_args=())
def tokens_to_nchw(x: torch.Tensor) -> torch.Tensor:
    """A channels-last copy of tokens (B, H, W, C) as a (B, C, H, W) map."""
    return x.permute(0, 3, 1, 2).clone(memory_format=torch.channels_last)


@tokens_to_nchw.register_fake
def _(x):
    b, h, w, c = x.shape
    return torch.empty((b, c, h, w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)


tokens_to_nchw.register_autograd(lambda ctx, grad: grad.permute(0, 2, 3, 1))


def nchw(x: torch.Tensor) -> torch.Tensor:
    """Channels-last tokens (B, H, W, C) as the (B, C, H, W) input of an NCHW conv: a permuted view (channels-last
    memory format). While torch.compile traces, a copy made by an op of its own (:func:`tokens_to_nchw`): the conv
    saves its input for the backward, and inductor cannot order the strides of a saved view whose sizes are
    symbolic quotients (a copy by a plain clone would be recomputed from that view)."""
    return tokens_to_nchw(x) if torch.compiler.is_compiling() else x.permute(0, 3, 1, 2)


def conv_tokens(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply an NCHW conv (or a sequence of them) to channels-last tokens: (B, H, W, C) -> (B, H', W', C')."""
    return conv(nchw(x)).permute(0, 2, 3, 1)


class DWConv2d(nn.Module):
    """Depthwise ``k x k`` convolution on channels-last tokens: (B, H, W, C) -> (B, H, W, C).

    Used for the block's conditional position encoding (3x3), the FFN's dwconv (3x3) and LePE (5x5).
    """

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, 1, kernel_size // 2, groups=channels)

    def forward(self, x: torch.Tensor, add: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``conv(x)``, or ``conv(x) + add`` (same shape; in inference summed into the conv's output)."""
        out = conv_tokens(self.conv, x)
        return out if add is None else add_into(out, add)


class ConvStem(nn.Module):
    """Four 3x3 convs (in -> C/2 stride 2, C/2 -> C/2, C/2 -> C stride 2, C -> C), BatchNorm after each,
    GELU after the first three. (B, in, H, W) -> (B, ceil(H/4), ceil(W/4), C) channels-last.

    ``proj`` is one Sequential so that its indices (0, 1, 3, 4, 6, 7, 9, 10) match the release keys.
    """

    def __init__(self, in_channels: int, embed_dims: int) -> None:
        super().__init__()
        half = embed_dims // 2
        self.proj = nn.Sequential(
            nn.Conv2d(in_channels, half, 3, 2, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
            nn.Conv2d(half, embed_dims, 3, 2, 1), nn.BatchNorm2d(embed_dims), nn.GELU(),
            nn.Conv2d(embed_dims, embed_dims, 3, 1, 1), nn.BatchNorm2d(embed_dims))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # contiguous tokens: the blocks' depthwise convs then run channels-last, their adds and norms stride 1
        return self.proj(x).permute(0, 2, 3, 1).contiguous()


class ConvDownsample(nn.Module):
    """3x3 stride-2 conv (with bias) + BatchNorm: (B, H, W, C_in) -> (B, ceil(H/2), ceil(W/2), C_out)
    contiguous."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.reduction = nn.Conv2d(in_channels, out_channels, 3, 2, 1)
        self.norm = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.reduction(nchw(x))).permute(0, 2, 3, 1).contiguous()


class ConvBN(nn.Sequential):
    """``conv`` (k x k, stride, padding k // 2, groups, bias), then optionally a BatchNorm2d named ``norm_name``
    (None: no BatchNorm) and an activation ``act``. (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride)).

    The BatchNorm's name follows each release's layout: ``bn`` in VMINet's ``Conv2d_BN``, ``norm`` in MLLA's
    ``ConvLayer``.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 kernel_size: int = 1,
                 stride: int = 1,
                 groups: int = 1,
                 bias: bool = True,
                 norm_name: Optional[str] = 'bn',
                 act: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.add_module('conv', nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2,
                                          groups=groups, bias=bias))
        if norm_name is not None:
            self.add_module(norm_name, nn.BatchNorm2d(out_channels))
        if act is not None:
            self.add_module('act', act)
