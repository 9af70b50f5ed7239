"""One PPMA/RMT block and one stage (docs/method.md §7), channels-last tokens (B, H, W, C); the stochastic depth and
the (optionally checkpointed) block loop that every family's stages share."""
from typing import Iterable, Optional, Tuple

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

from .attention import PolylinePathAttention
from .conv import ConvDownsample, DWConv2d
from .ffn import ConvFFN
from .rope import PositionTables, RasterRoPE2D


class DropPath(nn.Module):
    """Stochastic depth per sample: zero a residual branch with probability ``drop_prob`` (train only)."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0], ) + (1, ) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'


def run_blocks(blocks: Iterable[nn.Module], x: torch.Tensor, *args, with_cp: bool = False) -> torch.Tensor:
    """``x = block(x, *args)`` for each block; with ``with_cp``, while grad mode is on, each block runs under
    ``torch.utils.checkpoint`` (non-reentrant), recomputing its activations in the backward."""
    for block in blocks:
        if with_cp and torch.is_grad_enabled():
            x = cp.checkpoint(block, x, *args, use_reentrant=False)
        else:
            x = block(x, *args)
    return x


class PPMABlock(nn.Module):
    """``x += pos(x)``; ``x += drop_path(g1 * attn(LN(x)))``; ``x += drop_path(g2 * ffn(LN(x)))``.

    LN eps 1e-6; ``gamma_1``, ``gamma_2`` (1, 1, 1, C) exist only with layer scale.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 mlp_ratio: float,
                 attn_type: str,
                 mask: str = 'polyline',
                 attn_form: str = 'release',
                 impl: str = 'auto',
                 drop_path: float = 0.0,
                 layer_scale_init_value: Optional[float] = None) -> None:
        super().__init__()
        self.pos = DWConv2d(embed_dims, 3)
        self.retention_layer_norm = nn.LayerNorm(embed_dims, eps=1e-6)
        self.retention = PolylinePathAttention(embed_dims, num_heads, attn_type, mask, attn_form, impl)
        self.final_layer_norm = nn.LayerNorm(embed_dims, eps=1e-6)
        self.ffn = ConvFFN(embed_dims, int(embed_dims * mlp_ratio))
        self.drop_path = DropPath(drop_path)
        self.layer_scale = layer_scale_init_value is not None
        if self.layer_scale:
            self.gamma_1 = nn.Parameter(torch.full((1, 1, 1, embed_dims), float(layer_scale_init_value)))
            self.gamma_2 = nn.Parameter(torch.full((1, 1, 1, embed_dims), float(layer_scale_init_value)))

    def forward(self, x: torch.Tensor, pos: PositionTables) -> torch.Tensor:
        x = self.pos(x, add=x)
        attn = self.retention(self.retention_layer_norm(x), pos)
        ffn_in = x + self.drop_path(self.gamma_1 * attn if self.layer_scale else attn)
        ffn = self.ffn(self.final_layer_norm(ffn_in))
        return ffn_in + self.drop_path(self.gamma_2 * ffn if self.layer_scale else ffn)


class PPMAStage(nn.Module):
    """Blocks sharing one position module (``Relpos``), then an optional downsample.

    forward: (B, H, W, C) -> (stage output before downsample (B, H, W, C), next stage input).
    """

    def __init__(self,
                 embed_dims: int,
                 depth: int,
                 num_heads: int,
                 mlp_ratio: float,
                 attn_type: str,
                 mask: str = 'polyline',
                 attn_form: str = 'release',
                 impl: str = 'auto',
                 drop_paths: Tuple[float, ...] = (),
                 layer_scale_init_value: Optional[float] = None,
                 heads_range: Optional[float] = None,
                 out_channels: Optional[int] = None,
                 with_cp: bool = False) -> None:
        super().__init__()
        drop_paths = tuple(drop_paths) or (0.0, ) * depth
        self.with_cp = with_cp
        # Only the fixed-decay (RMT) mask stores decays with the position tables.
        self.Relpos = RasterRoPE2D(embed_dims // num_heads, num_heads, heads_range if mask == 'rmt' else None)
        self.blocks = nn.ModuleList([
            PPMABlock(embed_dims, num_heads, mlp_ratio, attn_type, mask, attn_form, impl, drop_paths[i],
                      layer_scale_init_value) for i in range(depth)
        ])
        self.downsample = ConvDownsample(embed_dims, out_channels) if out_channels is not None else None

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x = run_blocks(self.blocks, x, self.Relpos(x.shape[1], x.shape[2]), with_cp=self.with_cp)
        return x, (self.downsample(x) if self.downsample is not None else x)
