"""One PPMA/RMT block and one stage (docs/method.md §7), channels-last tokens (B, H, W, C); the stochastic depth,
the (optionally checkpointed) block loop that every family's stages share, and the stage of blocks PPMA and MLLA
share."""
from typing import Iterable, Optional, Tuple

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

from .attention import PolylinePathAttention
from .conv import DWConv2d
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
                 form: str = 'release',
                 impl: str = 'auto',
                 drop_path: float = 0.0,
                 layer_scale_init_value: Optional[float] = None) -> None:
        super().__init__()
        self.pos = DWConv2d(embed_dims, 3)
        self.retention_layer_norm = nn.LayerNorm(embed_dims, eps=1e-6)
        self.retention = PolylinePathAttention(embed_dims, num_heads, attn_type, mask, form, impl)
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


class BlockStage(nn.Module):
    """A stage's blocks, run in order (each under checkpointing with ``with_cp``), then an optional downsample.

    forward: (B, H, W, C) -> (stage output before downsample (B, H, W, C), next stage input). Each block is
    called as ``block(x, *self.block_args(x))``: subclasses give the tables their blocks share.
    """

    def __init__(self,
                 blocks: Iterable[nn.Module],
                 downsample: Optional[nn.Module] = None,
                 with_cp: bool = False) -> None:
        super().__init__()
        self.with_cp = with_cp
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample

    def block_args(self, x: torch.Tensor) -> tuple:
        """The arguments after x that every block of the stage takes, for input x (B, H, W, C)."""
        return ()

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x = run_blocks(self.blocks, x, *self.block_args(x), with_cp=self.with_cp)
        return x, (self.downsample(x) if self.downsample is not None else x)


class PPMAStage(BlockStage):
    """PPMA blocks sharing one position module (``Relpos``: the RoPE tables, and RMT's fixed decays), then an
    optional downsample (:class:`~mmppma.models.layers.conv.ConvDownsample`)."""

    def __init__(self,
                 relpos: RasterRoPE2D,
                 blocks: Iterable[PPMABlock],
                 downsample: Optional[nn.Module] = None,
                 with_cp: bool = False) -> None:
        super().__init__(blocks, downsample, with_cp)
        self.Relpos = relpos

    def block_args(self, x: torch.Tensor) -> Tuple[PositionTables]:
        return (self.Relpos(x.shape[1], x.shape[2]), )
