"""RMT's whole attention with the Manhattan decay, :func:`manhattan_attention`. The Manhattan mask is the
polyline mask of constant decays (form 'v2h'), so each implementation runs whole attention's (its paths sit beside
them, in :mod:`mmppma.ops.whole`): the dense reference on :func:`~mmppma.ops.masks.manhattan_decay_mask`, the torch
branches on per-head segment-sum tables, the whole attention kernels on per-head decay tables."""
import torch

from ..checks import check_fixed_decay
from ..plan import Op, run
from ..whole import reference, torch_impl, triton_impl

__all__ = ['manhattan_attention']

MANHATTAN_ATTENTION = Op('manhattan_attention', check_fixed_decay, reference, torch_impl, triton_impl)


def manhattan_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, *,
                        scale: float = 1.0, impl: str = 'auto') -> torch.Tensor:
    """RMT's whole attention: softmax(scale * q k^T + log_decay * (|i-k| + |j-l|)) v.

    q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); log_decay: (heads,) or (B, heads), <= 0.
    """
    return run(MANHATTAN_ATTENTION, (scale, ), impl, q, k, v, log_decay)
