"""The polyline mask applied without forming it (paper Algorithm 1, Appendix A.7; docs/method.md §4): the 1D
decay scan :func:`decay_scan_1d` and the mask-vector product :func:`polyline_mask_matvec` built on it, dispatched
(:mod:`mmppma.ops.plan`) to :mod:`.reference` (dense), :mod:`.torch_impl` or :mod:`.triton_impl`. The O(N) linear
and decomposed attentions that apply the mask this way on the torch path are :mod:`mmppma.ops.linear`'s.

The 2D mask factorizes into 1D structured masks: ``L_v2h x`` is a bidirectional decay scan down every column
(``lb``), then along every row (``la``); ``L_h2v x`` is the other order. A bidirectional scan is a symmetric
1-semiseparable product ``y_t = sum_s exp(segsum(t, s)) x_s``.
"""
import torch

from ..checks import check_matvec, check_scan
from ..devices import triton_available
from ..plan import Op, run
from . import reference, torch_impl

if triton_available():  # the Triton paths import triton
    from . import triton_impl
else:  # no implementation resolves to 'triton' (plan.resolve_impl)
    triton_impl = None

__all__ = ['decay_scan_1d', 'polyline_mask_matvec']

DEFAULT_CHUNK = 64


DECAY_SCAN_1D = Op('decay_scan_1d', check_scan, reference, torch_impl, triton_impl)
POLYLINE_MASK_MATVEC = Op('polyline_mask_matvec', check_matvec, reference, torch_impl, triton_impl)


def decay_scan_1d(x: torch.Tensor, log_decay: torch.Tensor, *, impl: str = 'auto',
                  chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Bidirectional 1D decay scan ``y_t = sum_s exp(segsum(t, s)) x_s`` along the second-last dim of x.

    x: (..., L, D); log_decay: (..., L) per-token log-decays (<= 0). Computed in float32 at least; returns
    x's dtype. ``torch``: lines up to ``chunk`` long use one dense tile, longer ones the O(L) chunkwise scan;
    ``reference``: the dense L x L mask; ``triton``: a tiled kernel.
    """
    return run(DECAY_SCAN_1D, (chunk, ), impl, x, log_decay)


def polyline_mask_matvec(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, *, form: str = 'v2h',
                         impl: str = 'auto', chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """``L @ x`` for the polyline path mask, without forming L (Algorithm 1).

    x: (B, heads, H, W, D); la, lb: (B, heads, H, W). form ``'v2h'``: L = exp(M) (column scan, then
    row scan); ``'h2v'``: L^T (row scan, then column scan); ``'2d'``: L2D = L + L^T.
    ``impl``: ``'reference'`` forms the dense mask; the others choose the 1D scans' implementation.
    """
    return run(POLYLINE_MASK_MATVEC, (form, chunk), impl, x, la, lb)
