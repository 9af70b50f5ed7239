"""Convolutional pieces of the PPMA/RMT macro architecture (docs/method.md §7), on channels-last tokens.

Attribute names (``conv``, ``proj``, ``reduction``, ``norm``) follow the release's checkpoint layout.
:class:`ConvBN` is the conv-BatchNorm-activation unit of MLLA's and VMINet's stems and downsamples.
"""
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.ops.devices import on_gpu
from mmppma.ops.export import exporting

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


def _conv_memory_format(x: torch.Tensor) -> torch.memory_format:
    """The memory format of a conv's output on x: channels-last for a channels-last (and not also contiguous)
    input, else contiguous. The op below and its fake impl both apply it, so their strides agree."""
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


@torch.library.custom_op('mmppma::conv2d', mutates_args=())
def conv2d_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: List[int],
              padding: List[int], dilation: List[int], groups: int) -> torch.Tensor:
    """``F.conv2d`` as one opaque op (see :class:`Conv2d`)."""
    out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return out.contiguous(memory_format=_conv_memory_format(x))


@conv2d_op.register_fake
def _(x, weight, bias, stride, padding, dilation, groups):
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups).contiguous(
        memory_format=_conv_memory_format(x))


def _conv2d_grads(grad, x, weight, stride, padding, dilation, groups, output_mask):
    """The gradients of :func:`conv2d_op` that ``output_mask`` asks for, in the order (x, weight, bias): x's in
    the memory format of the conv's output on x, the others contiguous."""
    bias_sizes = [weight.shape[0]] if output_mask[2] else None
    grads = torch.ops.aten.convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, False,
                                                [0, 0], groups, output_mask)
    formats = (_conv_memory_format(x), torch.contiguous_format, torch.contiguous_format)
    return [g.contiguous(memory_format=f) for g, f, m in zip(grads, formats, output_mask) if m]


@torch.library.custom_op('mmppma::conv2d_backward', mutates_args=())
def conv2d_backward_op(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stride: List[int],
                       padding: List[int], dilation: List[int], groups: int,
                       output_mask: List[bool]) -> List[torch.Tensor]:
    """``aten.convolution_backward`` of :func:`conv2d_op` as one opaque op: inductor lowers
    ``aten.convolution_backward`` of an input that needs a gradient with that gradient's strides guarded to
    the numbers of the first compile, which would again compile every input size anew."""
    return _conv2d_grads(grad, x, weight, stride, padding, dilation, groups, output_mask)


@conv2d_backward_op.register_fake
def _(grad, x, weight, stride, padding, dilation, groups, output_mask):
    return _conv2d_grads(grad, x, weight, stride, padding, dilation, groups, output_mask)


def _conv2d_setup_context(ctx, inputs, output):
    x, weight, bias, ctx.stride, ctx.padding, ctx.dilation, ctx.groups = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight)


def _conv2d_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    grads = iter(conv2d_backward_op(grad, x, weight, ctx.stride, ctx.padding, ctx.dilation, ctx.groups, mask))
    dx, dw, db = (next(grads) if m else None for m in mask)
    return dx, dw, db, None, None, None, None


conv2d_op.register_autograd(_conv2d_backward, setup_context=_conv2d_setup_context)


def _as_own_ops(x: torch.Tensor) -> bool:
    """Whether the convs on ``x`` and their input copies run as the ops above: while torch.compile traces for the
    CPU (not for a GPU, :func:`mmppma.ops.devices.on_gpu`, where inductor's own conv and layout handling
    apply), not in an export (:func:`mmppma.ops.export.exporting`), which needs ops that ONNX translates."""
    return torch.compiler.is_compiling() and not exporting() and not on_gpu(x)


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters and keys); while torch.compile traces for the CPU, the conv is one op of its
    own (:func:`conv2d_op`, its backward :func:`conv2d_backward_op`) instead of ``aten.convolution``.

    Why: on CPU with oneDNN, inductor turns on its conv layout optimization for every graph that holds an
    ``aten.convolution``, dynamic shapes or not. It then gives each 4-D activation saved for the backward
    upstream of a conv channels-last strides (our (B, H, W, C) tokens included), and AOTAutograd compiles the
    backward with those strides as concrete numbers of the first dynamic compile: the backward's stride
    arithmetic then guards the stage sizes to those numbers (``Eq((H - 1) // 8 + 1, 12)``), so every new input
    size would compile again. Without an ``aten.convolution`` in the graph the layout optimization stays off, every
    saved activation keeps the strides it was traced with, and one dynamic graph serves all sizes. A GPU graph
    (CUDA tensors, or the simulated device's) and an export (:func:`mmppma.ops.export.exporting`) take the
    plain conv.
    """

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor]) -> torch.Tensor:
        if _as_own_ops(input) and self.padding_mode == 'zeros' and not isinstance(self.padding, str):
            return conv2d_op(input, weight, bias, list(self.stride), list(self.padding), list(self.dilation),
                             self.groups)
        return super()._conv_forward(input, weight, bias)


def nchw(x: torch.Tensor) -> torch.Tensor:
    """Channels-last tokens (B, H, W, C) as the (B, C, H, W) input of an NCHW conv: a permuted view (channels-last
    memory format). While torch.compile traces for the CPU, a copy made by an op of its own (:func:`tokens_to_nchw`):
    the conv saves its input for the backward, and inductor cannot order the strides of a saved view whose sizes
    are symbolic quotients (a copy by a plain clone would be recomputed from that view)."""
    return tokens_to_nchw(x) if _as_own_ops(x) else x.permute(0, 3, 1, 2)


def conv_tokens(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply an NCHW conv (or a sequence of them) to channels-last tokens: (B, H, W, C) -> (B, H', W', C')."""
    return conv(nchw(x)).permute(0, 2, 3, 1)


class DWConv2d(nn.Module):
    """Depthwise ``k x k`` convolution on channels-last tokens: (B, H, W, C) -> (B, H, W, C).

    Used for the block's conditional position encoding (3x3), the FFN's dwconv (3x3) and LePE (5x5).
    """

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = Conv2d(channels, channels, kernel_size, 1, kernel_size // 2, groups=channels)

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
            Conv2d(in_channels, half, 3, 2, 1), nn.BatchNorm2d(half), nn.GELU(),
            Conv2d(half, half, 3, 1, 1), nn.BatchNorm2d(half), nn.GELU(),
            Conv2d(half, embed_dims, 3, 2, 1), nn.BatchNorm2d(embed_dims), nn.GELU(),
            Conv2d(embed_dims, embed_dims, 3, 1, 1), nn.BatchNorm2d(embed_dims))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # contiguous tokens: the blocks' depthwise convs then run channels-last, their adds and norms stride 1
        return self.proj(x).permute(0, 2, 3, 1).contiguous()


class ConvDownsample(nn.Module):
    """3x3 stride-2 conv (with bias) + BatchNorm: (B, H, W, C_in) -> (B, ceil(H/2), ceil(W/2), C_out)
    contiguous."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.reduction = Conv2d(in_channels, out_channels, 3, 2, 1)
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
        self.add_module('conv', Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2,
                                       groups=groups, bias=bias))
        if norm_name is not None:
            self.add_module(norm_name, nn.BatchNorm2d(out_channels))
        if act is not None:
            self.add_module('act', act)
