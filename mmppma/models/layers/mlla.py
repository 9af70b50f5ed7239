"""Layers of MLLA, Mamba-Like Linear Attention (Han et al., "Demystify Mamba in Vision: A Linear Attention
Perspective", NeurIPS 2024), and of its polyline-path-masked variant PPMLA; channels-last tokens (B, H, W, C).

Structure and attribute names follow the public release (LeapLabTHU/MLLA, ``models/mlla.py``), so that its
state dicts map one to one (``cpe1``, ``norm1``, ``in_proj``, ``act_proj``, ``dwc``, ``attn.qk``,
``attn.lepe``, ``out_proj``, ``cpe2``, ``norm2``, ``mlp.fc1``/``fc2``; stem ``conv1``-``conv3``; downsample
``conv.0``-``conv.2``). Differences, all for inputs of any size (none changes a parameter):

* RoPE is computed for the actual (H, W) at forward time (the release's classification model stores a
  table for the 224x224 training size as a buffer ``attn.rope.rotations``; its dense-prediction model
  recomputes it per input, as here). We keep no buffer: that release key is simply not loaded.
* The stem pads the image to a multiple of 4 and each downsample pads an odd map to even (bottom/right,
  zeros), as the release's dense-prediction model does; at sizes divisible by 32 nothing is padded.
"""
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.ops import ppma_linear_attention
from mmppma.utils.checks import check_choice

from .block import BlockStage, DropPath
from .conv import Conv2d, ConvBN, conv_tokens
from .path_embed import PathEmbed
from .rope import apply_rope

#: MLLA's mask switch: 'none' (MLLA's linear attention) or 'polyline' (PPMLA: times the polyline path mask).
MLLA_MASKS = ('none', 'polyline')


def mlla_rope_tables(height: int, width: int, channels: int, device=None,
                     base: float = 10000.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """The release's 2D RoPE over all C channels (before the head split): (sin, cos), each (H, W, C) float32.

    Channel pair m (channels 2m, 2m+1) turns by ``i * theta_m`` (row i) for m < C/4 and by
    ``j * theta_(m - C/4)`` (column j) for m >= C/4, with ``theta_t = base^(-t / (C/4))``. Use with
    :func:`~mmppma.models.layers.rope.apply_rope` (``x*cos + rot(x)*sin``, the complex product of each pair).
    """
    if channels % 4:
        raise ValueError(f'MLLA RoPE needs channels divisible by 4 (pairs turned by row and by column); got '
                         f'{channels}')
    quarter = channels // 4
    theta = 1.0 / base**(torch.arange(quarter, device=device, dtype=torch.float64) / quarter)
    rows = torch.arange(height, device=device, dtype=torch.float64)[:, None, None] * theta  # (H, 1, C/4)
    cols = torch.arange(width, device=device, dtype=torch.float64)[None, :, None] * theta  # (1, W, C/4)
    angles = torch.cat([rows.expand(height, width, quarter), cols.expand(height, width, quarter)], dim=-1)
    angles = angles.repeat_interleave(2, dim=-1).float()  # (H, W, C): one angle per channel pair
    return angles.sin(), angles.cos()


def depthwise_conv3x3(channels: int) -> Conv2d:
    return Conv2d(channels, channels, 3, padding=1, groups=channels)


class MLLAAttention(nn.Module):
    """MLLA's linear attention with RoPE and LePE (``attn`` in the release), or PPMLA.

    ``q, k = elu(qk(x)) + 1`` (one Linear(C, 2C)); ``v = x`` (no v projection: the block's ``in_proj`` is it).

    * ``mask='none'`` (MLLA, the release): ``out_i = sum_j (q~_i . k~_j) v_j / (N * (q_i . mean_j k_j + 1e-6))``
      per head, with ``q~, k~`` the RoPE'd q, k and the normalizer from the un-rotated ones; O(N d^2).
    * ``mask='polyline'`` (PPMLA): the same attention map multiplied by the polyline path mask L2D = L + L^T (paper
      Appendix A.7, Eq. 34), normalized by the masked mass, all in O(N) without an N x N tensor::

          out_i = sum_j (q~_i . k~_j) L2D_ij v_j / (sum_j (q_i . k_j) L2D_ij + eps)

      With all decays 0 (L2D = 2 everywhere) this is MLLA's attention (up to eps). The per-head, per-token
      log-decays come from PPMA's :class:`PathEmbed` (``A_log``/``dt_bias`` parametrization, docs/method.md §1) on
      the attention input x, which is also what q, k, v come from.

    ``+ lepe(v)`` (depthwise 3x3) in both. ``impl`` is the ops' implementation for PPMLA.
    """

    def __init__(self, embed_dims: int, num_heads: int, mask: str = 'none', impl: str = 'auto',
                 eps: float = 1e-6) -> None:
        super().__init__()
        check_choice('mask', mask, MLLA_MASKS)
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        self.embed_dims, self.num_heads, self.head_dims = embed_dims, num_heads, embed_dims // num_heads
        self.mask, self.impl, self.eps = mask, impl, eps
        self.qk = nn.Linear(embed_dims, embed_dims * 2)
        self.lepe = depthwise_conv3x3(embed_dims)
        self.path_embed = PathEmbed(num_heads, self.head_dims) if mask == 'polyline' else None

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) -> (B, n, H, W, d)."""
        b, h, w, _ = t.shape
        return t.view(b, h, w, self.num_heads, self.head_dims).permute(0, 3, 1, 2, 4)

    def forward(self, x: torch.Tensor, rope: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: (B, H, W, C); rope: (sin, cos) from :func:`mlla_rope_tables` for this (H, W, C)."""
        b, h, w, c = x.shape
        q, k = (F.elu(t) + 1.0 for t in self.qk(x).chunk(2, dim=-1))
        sin, cos = (t.to(q.dtype) for t in rope)
        q_rope, k_rope = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
        q, k, v, q_rope, k_rope = map(self._heads, (q, k, x, q_rope, k_rope))
        if self.mask == 'none':
            out = self._linear_attention(q, k, v, q_rope, k_rope)
        else:
            la, lb = self.path_embed(x)
            out = self._masked_linear_attention(q, k, v, q_rope, k_rope, la, lb)
        out = out.permute(0, 2, 3, 1, 4).reshape(b, h, w, c)
        return out + conv_tokens(self.lepe, x)

    def _linear_attention(self, q, k, v, q_rope, k_rope) -> torch.Tensor:
        """The release's normalized linear attention on (B, n, H, W, d) tensors, in its order of products
        (its 1/sqrt(N) scalings keep k~^T v small in half precision)."""
        shape = v.shape
        q, k, v, q_rope, k_rope = (t.flatten(2, 3) for t in (q, k, v, q_rope, k_rope))  # (B, n, N, d)
        # 1 / sqrt(N) from a tensor of N ones: under torch.compile with dynamic shapes, a Python scalar made
        # from the token count (which the padding derives with a modulo) is one inductor's scalar pass cannot lower
        scale = q.new_ones(q.shape[2], dtype=torch.float64).sum().rsqrt()
        z = 1.0 / (q @ k.mean(dim=2, keepdim=True).transpose(-2, -1) + self.eps)  # (B, n, N, 1)
        kv = (k_rope.transpose(-2, -1) * scale) @ (v * scale)  # (B, n, d, d)
        return ((q_rope @ kv) * z).view(shape)

    def _masked_linear_attention(self, q, k, v, q_rope, k_rope, la, lb) -> torch.Tensor:
        """PPMLA on (B, n, H, W, d) through :func:`~mmppma.ops.ppma_linear_attention`: numerator and masked
        mass are two O(N) PPMDA calls (Theorem 3); the numerator's features are the RoPE'd ones, the mass's the
        un-rotated (non-negative) ones, as in MLLA (``normalizer``: the RoPE'd ones can be negative, so their
        masked mass can vanish)."""
        return ppma_linear_attention(q_rope, k_rope, v, la, lb, normalize=True, eps=self.eps, form='2d',
                                     impl=self.impl, normalizer=(q, k))

    def extra_repr(self) -> str:
        return f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, mask={self.mask!r}'


class MLLAMlp(nn.Module):
    """``fc2(gelu(fc1 x))`` (the release's ``Mlp``, dropout 0)."""

    def __init__(self, embed_dims: int, hidden_dims: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, embed_dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MLLABlock(nn.Module):
    """One MLLA block on (B, H, W, C) (LayerNorms eps 1e-5, as the release)::

        x = x + cpe1(x)
        h = norm1(x);  gate = silu(act_proj h);  h = silu(dwc(in_proj h))
        x = x + drop_path(out_proj(attn(h) * gate))
        x = x + cpe2(x)
        x = x + drop_path(mlp(norm2 x))
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 mlp_ratio: float = 4.0,
                 mask: str = 'none',
                 impl: str = 'auto',
                 drop_path: float = 0.0) -> None:
        super().__init__()
        self.cpe1 = depthwise_conv3x3(embed_dims)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.in_proj = nn.Linear(embed_dims, embed_dims)
        self.act_proj = nn.Linear(embed_dims, embed_dims)
        self.dwc = depthwise_conv3x3(embed_dims)
        self.act = nn.SiLU()
        self.attn = MLLAAttention(embed_dims, num_heads, mask, impl)
        self.out_proj = nn.Linear(embed_dims, embed_dims)
        self.drop_path = DropPath(drop_path)
        self.cpe2 = depthwise_conv3x3(embed_dims)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.mlp = MLLAMlp(embed_dims, int(embed_dims * mlp_ratio))

    def forward(self, x: torch.Tensor, rope: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + conv_tokens(self.cpe1, x)
        h = self.norm1(x)
        gate = self.act(self.act_proj(h))
        h = self.act(conv_tokens(self.dwc, self.in_proj(h)))
        x = x + self.drop_path(self.out_proj(self.attn(h, rope) * gate))
        x = x + conv_tokens(self.cpe2, x)
        return x + self.drop_path(self.mlp(self.norm2(x)))


def conv_layer(in_channels: int, out_channels: int, kernel_size: int, norm: bool = True, relu: bool = True,
               **conv) -> ConvBN:
    """The release's ``ConvLayer``: conv (``conv``: stride, groups, bias, as :class:`~.conv.ConvBN`), then
    BatchNorm ``norm`` and ReLU ``act`` where asked."""
    return ConvBN(in_channels, out_channels, kernel_size, norm_name='norm' if norm else None,
                  act=nn.ReLU() if relu else None, **conv)


class MLLAStem(nn.Module):
    """(B, in, H, W) -> (B, ceil(H/4), ceil(W/4), C) channels-last.

    ``conv1``: 3x3 s2 -> C/2 (BN, ReLU); ``conv2``: two 3x3 C/2 convs (BN; ReLU after the first) as a
    residual; ``conv3``: 3x3 s2 -> 4C (BN, ReLU), then 1x1 -> C (BN). Convs without bias. The image is padded
    (bottom/right, zeros) to a multiple of 4 first, as the release's dense-prediction model does.
    """

    def __init__(self, in_channels: int, embed_dims: int) -> None:
        super().__init__()
        half = embed_dims // 2
        self.conv1 = conv_layer(in_channels, half, 3, stride=2, bias=False)
        self.conv2 = nn.Sequential(
            conv_layer(half, half, 3, bias=False), conv_layer(half, half, 3, relu=False, bias=False))
        self.conv3 = nn.Sequential(
            conv_layer(half, embed_dims * 4, 3, stride=2, bias=False),
            conv_layer(embed_dims * 4, embed_dims, 1, relu=False, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        # padding to a multiple of 4 by floor division: under torch.compile with dynamic shapes a modulo of a
        # size reaches BatchNorm's running-variance correction, where inductor's scalar pass cannot lower it
        x = F.pad(x, (0, (w + 3) // 4 * 4 - w, 0, (h + 3) // 4 * 4 - h))
        x = self.conv1(x)
        x = self.conv2(x) + x
        # contiguous tokens, as PPMA's stem (layers/conv.py): the blocks then read stride-1 channels, and
        # torch.compile with dynamic shapes does not save a permuted view with symbolic strides
        return self.conv3(x).permute(0, 2, 3, 1).contiguous()


class MLLADownsample(nn.Module):
    """The release's ``PatchMerging``, an inverted residual without the residual:
    1x1 C -> r*C' (ReLU), 3x3 depthwise stride 2 (ReLU), 1x1 -> C' (BN); ``r`` = 4, C' the next stage's dims.
    (B, H, W, C) -> (B, ceil(H/2), ceil(W/2), C'); an odd map is padded to even first (bottom/right, zeros).
    """

    def __init__(self, in_channels: int, out_channels: int, ratio: float = 4.0) -> None:
        super().__init__()
        hidden = int(out_channels * ratio)
        self.conv = nn.Sequential(
            conv_layer(in_channels, hidden, 1, norm=False),
            conv_layer(hidden, hidden, 3, stride=2, groups=hidden, norm=False),
            conv_layer(hidden, out_channels, 1, relu=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[1:3]
        x = F.pad(x, (0, 0, 0, (w + 1) // 2 * 2 - w, 0, (h + 1) // 2 * 2 - h))  # as the stem: no modulo
        return conv_tokens(self.conv, x).contiguous()  # as the stem


class MLLAStage(BlockStage):
    """MLLA blocks sharing one RoPE table (computed for the input's H, W, C), then an optional downsample
    (:class:`MLLADownsample`).

    forward: (B, H, W, C) -> (stage output before downsample (B, H, W, C), next stage input).
    """

    def block_args(self, x: torch.Tensor) -> Tuple[Tuple[torch.Tensor, torch.Tensor]]:
        return (mlla_rope_tables(x.shape[1], x.shape[2], x.shape[3], device=x.device), )
