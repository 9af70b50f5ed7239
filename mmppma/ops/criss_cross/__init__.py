"""Decomposed criss-cross attention: :func:`criss_cross_attention` (PPMCCA) and RMT's
:func:`rmt_criss_cross_attention`, row attention and column attention (:mod:`mmppma.ops.line`) composed in the
order the ``form`` names, dispatched (:mod:`mmppma.ops.plan`) to :mod:`.reference` (dense), :mod:`.torch_impl` or
:mod:`.triton_impl`."""
import torch

from ..checks import check_criss_cross, check_fixed_decay
from ..devices import triton_available
from ..plan import Op, run
from . import reference, torch_impl

if triton_available():  # the Triton paths import triton
    from . import triton_impl
else:  # no implementation resolves to 'triton' (plan.resolve_impl)
    triton_impl = None

__all__ = ['criss_cross_attention', 'rmt_criss_cross_attention']


CRISS_CROSS_ATTENTION = Op('criss_cross_attention', check_criss_cross, reference, torch_impl, triton_impl)
RMT_CRISS_CROSS_ATTENTION = Op('rmt_criss_cross_attention', check_fixed_decay, reference, torch_impl, triton_impl)


def criss_cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: torch.Tensor,
                          lb: torch.Tensor, *, scale: float = 1.0, form: str = 'release', tables: bool = False,
                          impl: str = 'auto') -> torch.Tensor:
    """Decomposed criss-cross masked attention (PPMCCA).

    Row attention ``Aw = softmax(scale * q_row k_row^T + Sa)`` (W x W per row), column attention
    ``Ah = softmax(scale * q_col k_col^T + Sb)`` (H x H per column), with the 1D segment-sum biases.
    form ``'release'``: 0.5 Ah(Aw v) + 0.5 Aw(Ah v); ``'v2h'``: Aw(Ah v) (columns first: a key reaches the
    query down its column, then along the query's row, the V2H path); ``'h2v'``: Ah(Aw v) (rows first, RMT).
    Shapes and ``tables`` as :func:`~mmppma.ops.ppma_attention`. Never forms an N x N tensor (torch path).
    """
    return run(CRISS_CROSS_ATTENTION, (scale, form, tables), impl, q, k, v, la, lb)


def rmt_criss_cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, *,
                              scale: float = 1.0, impl: str = 'auto') -> torch.Tensor:
    """RMT's decomposed attention: rows first, then columns (form ``'h2v'`` of :func:`criss_cross_attention`),
    fixed decay ``log_decay * |d|`` per axis.

    log_decay: (heads,) or (B, heads). The bias is built once per head, (heads, W, W) and (heads, H, H).
    """
    return run(RMT_CRISS_CROSS_ATTENTION, (scale, ), impl, q, k, v, log_decay)
