"""Decay scan and the 2-D mask-vector product, dense references: the L x L (or N x N) mask formed and multiplied,
float64 for float64 inputs (the test oracles); the reference paths of :func:`~mmppma.ops.decay_scan_1d` and
:func:`~mmppma.ops.polyline_mask_matvec`."""
import functools

import torch

from ..checks import table_dtype
from ..masks import polyline_mask, segment_sum


def decay_scan_reference(x: torch.Tensor, log_decay: torch.Tensor) -> torch.Tensor:
    """``exp(segment_sum(cumsum(log_decay))) @ x``, x and log_decay in the table dtype."""
    return segment_sum(log_decay.cumsum(-1)).exp() @ x


def matvec_reference(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, form: str) -> torch.Tensor:
    """``L @ x`` with the dense mask of ``form``; x (B, heads, H, W, D)."""
    b, heads, h, w, d = x.shape
    lmask = polyline_mask(la, lb, form=form, space='linear')
    return (lmask @ x.to(lmask.dtype).reshape(b, heads, h * w, d)).reshape(x.shape).to(x.dtype)


def in_table_dtype(scan, x: torch.Tensor, log_decay: torch.Tensor, *args) -> torch.Tensor:
    """``scan(x, log_decay, *args)`` computed in the table dtype (float32 at least), returned in x's dtype."""
    dtype = table_dtype(x, log_decay)
    return scan(x.to(dtype), log_decay.to(dtype), *args).to(x.dtype)


def decay_scan_1d_plan(x, log_decay, chunk: int):
    """The reference path of :func:`~mmppma.ops.decay_scan_1d` (:class:`~mmppma.ops.plan.Op`)."""
    return functools.partial(in_table_dtype, decay_scan_reference)


def polyline_mask_matvec_plan(x, la, lb, form: str, chunk: int):
    """The reference path of :func:`~mmppma.ops.polyline_mask_matvec`: the dense mask ('2d': of each path)."""
    if form == '2d':
        return lambda x, la, lb: matvec_reference(x, la, lb, 'v2h') + matvec_reference(x, la, lb, 'h2v')
    return functools.partial(matvec_reference, form=form)
