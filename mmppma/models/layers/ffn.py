"""The block's feed-forward network with a depthwise conv inside (docs/method.md §7)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .conv import DWConv2d
from .inplace import records_grad


class ConvFFN(nn.Module):
    """``h = gelu(fc1 x); h = h + dwconv3x3(h); fc2 h`` on channels-last tokens (B, H, W, C)."""

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.dwconv = DWConv2d(hidden_dims, 3)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        # inference: in place, no second hidden-sized tensor (the largest activation of the block)
        h = F.gelu(h) if records_grad(h) else torch.ops.aten.gelu_(h)
        dropping = self.training and self.drop.p > 0  # nothing to run otherwise
        if dropping:
            h = self.drop(h)
        h = self.dwconv(h, add=h)
        h = self.fc2(h)
        return self.drop(h) if dropping else h
