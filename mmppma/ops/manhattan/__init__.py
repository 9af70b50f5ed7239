"""RMT's whole attention with the Manhattan decay, :func:`manhattan_attention`. The Manhattan mask is the
polyline mask of constant decays (form 'v2h'), so each impl runs whole attention's: the dense reference on
:func:`~mmppma.ops.masks.manhattan_decay_mask`, the torch branches on per-head segment-sum tables, the whole
attention kernels on per-head decay tables."""
import torch

from ..checks import check_log_decay, check_qkv, table_dtype
from ..dispatch import resolve_impl
from ..masks import head_decay_tables, manhattan_decay_mask, manhattan_segment_sums
from ..plan import run
from ..whole.reference import whole_reference
from ..whole.torch_impl import whole_torch

__all__ = ['manhattan_attention']


def manhattan_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, *,
                        scale: float = 1.0, impl: str = 'auto') -> torch.Tensor:
    """RMT's whole attention: softmax(scale * q k^T + log_decay * (|i-k| + |j-l|)) v.

    q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); log_decay: (heads,) or (B, heads), <= 0.
    """
    return run('manhattan_attention', _plan, (scale, impl), q, k, v, log_decay)


def _plan(q, k, v, log_decay, scale: float, impl: str, traced=None):
    """The call that runs :func:`manhattan_attention` on inputs like these (checked here); ``traced`` goes to
    the Triton path."""
    check_qkv(q, k, v)
    check_log_decay(log_decay, q)
    b, heads, h, w, _ = q.shape
    requested, impl = impl, resolve_impl(impl, 'manhattan_attention', (q, k, v))
    dtype = table_dtype(q, k, v, log_decay)
    if impl == 'triton':
        from ..triton_support.preflight import triton_plan
        from ..whole.triton_impl import whole_attention_triton
        return triton_plan(
            'manhattan_attention',
            lambda q, k, v, log_decay: whole_attention_triton(q, k, v, *head_decay_tables(log_decay, q.shape[:-1]),
                                                              scale, 'v2h', 'manhattan_attention', traced),
            (q, k, v, log_decay), requested, lambda *t: manhattan_attention(*t, scale=scale, impl='torch'))
    if impl == 'reference':
        def reference(q, k, v, log_decay):
            m = manhattan_decay_mask(log_decay.to(dtype), h, w)
            m = m if m.dim() == 4 else m.unsqueeze(0)
            return whole_reference(q, k, v, m.expand(b, -1, -1, -1), scale, 'v2h')
        return reference
    return lambda q, k, v, log_decay: whole_torch(q, k, v, *manhattan_segment_sums(log_decay, h, w, dtype), scale,
                                                  'v2h')
