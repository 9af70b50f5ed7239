"""FLOPs from mmengine's counter (with our attention handlers) against the paper's numbers."""
import pytest
import torch
import torch.nn as nn

from mmppma.models import PPMA, PPMAClsHead
from mmppma.models.utils import count_flops

from .conftest import SMALL_ARCH


class Classifier(nn.Module):

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = PPMAClsHead(1000, in_channels=backbone.embed_dims[-1], loss=nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def test_ppma_tiny_flops_match_paper():
    """Paper Table 1/4: PPMA-T 2.7 GFLOPs at 224x224 (2.71 in Table 4). Within 5%."""
    model = Classifier(PPMA('tiny', out_indices=(3, ), out_norm=False)).eval()
    total, by_op = count_flops(model, torch.randn(1, 3, 224, 224))
    assert total == pytest.approx(2.7e9, rel=0.05)
    assert not any('PythonOp' in op and n == 0 for op, n in by_op.items())


def test_attention_flops_are_counted():
    """Whole attention is counted as q k^T + P v with every mask (learned, fixed, none)."""
    x = torch.randn(1, 3, 64, 64)  # whole stages at 4x4 and 2x2 tokens
    heads_dims = [(n, c // n) for c, n in zip(SMALL_ARCH['embed_dims'], SMALL_ARCH['num_heads'])]
    tokens = [16 * 16, 8 * 8, 4 * 4, 2 * 2]
    want = sum(depth * n * t * t * 2 * d
               for depth, (n, d), t, kind in zip(SMALL_ARCH['depths'], heads_dims, tokens, SMALL_ARCH['attn_types'])
               if kind == 'whole')
    for mask in ('polyline', 'rmt', 'none'):
        _, by_op = count_flops(PPMA(SMALL_ARCH, mask=mask).eval(), x)
        assert by_op['PythonOp.WholeAttentionForFlops'] == want, mask
