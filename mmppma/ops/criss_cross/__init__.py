"""Decomposed criss-cross attention: :func:`criss_cross_attention` (PPMCCA) and RMT's
:func:`rmt_criss_cross_attention`, row attention and column attention (:mod:`mmppma.ops.line`) composed in the
order the ``form`` names, dispatched to :mod:`.reference` (dense), :mod:`.torch_impl` or :mod:`.triton_impl`."""
import functools

import torch

from ..checks import check_log_decay, check_qkv, checked_impl, table_dtype
from ..dispatch import exporting, resolve_impl
from ..forms import CRISS_CROSS_FORMS
from ..line.torch_impl import SegmentMaskedSoftmax, padded_segment_bias, segment_bias, segment_softmax
from ..masks import decay_tables, head_decay_map, head_decay_tables, manhattan_segment_sums, table_decays
from ..plan import run
from ..torch_support import eager_inference, export_loops, pad_last, padded
from .reference import criss_cross_reference
from .torch_impl import (
    SegmentCrissCrossRelease,
    criss_cross_core,
    criss_cross_export,
    criss_cross_slices,
)

__all__ = ['criss_cross_attention', 'rmt_criss_cross_attention']


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
    return run('criss_cross_attention', _plan, (scale, form, tables, impl), q, k, v, la, lb)


def _plan(q, k, v, la, lb, scale: float, form: str, tables: bool, impl: str, traced=None):
    """The call that runs :func:`criss_cross_attention` on inputs like these (checked here); ``traced`` goes to
    the Triton path."""
    requested, impl = impl, checked_impl('criss_cross_attention', CRISS_CROSS_FORMS, q, k, v, la, lb, form, impl)
    if impl == 'reference':
        def dense(q, k, v, la, lb):
            if tables:
                la, lb = table_decays(la, lb)
            return criss_cross_reference(q, k, v, la, lb, scale, form).to(v.dtype)
        return dense
    if impl == 'triton':
        from ..triton_support.preflight import plan_with_tables
        from .triton_impl import criss_cross_attention_triton
        return plan_with_tables('criss_cross_attention', criss_cross_attention_triton, (q, k, v, la, lb), scale,
                                form, tables, requested, criss_cross_attention, traced)
    return functools.partial(_criss_cross_torch, scale=scale, form=form, tables=tables)


def _criss_cross_torch(q, k, v, la, lb, scale: float, form: str, tables: bool = False):
    dtype = table_dtype(q, k, v, la, lb)
    ca, cb = (la.to(dtype), lb.to(dtype)) if tables else decay_tables(la, lb)
    q, k, v_in = q.to(dtype), k.to(dtype), v.to(dtype)
    if eager_inference(q, k, v_in, la, lb):
        out = criss_cross_slices(q, k, v_in, padded_segment_bias(ca, dtype),
                                 padded_segment_bias(cb.transpose(-1, -2), dtype), scale, form)
    elif exporting():
        if export_loops('criss_cross', ca.shape[-1] * ca.shape[-2]):
            rows = (segment_bias(ca.shape[-1], dtype, q.device), (ca.permute(2, 0, 1, 3), ))
            cols = (segment_bias(cb.shape[-2], dtype, q.device), (cb.permute(3, 0, 1, 2), ))
            out = criss_cross_export(q, k, v_in, rows, cols, scale, form)
        else:
            out = criss_cross_core(q, k, v_in, lambda s: segment_softmax(s, ca),
                                   lambda s: segment_softmax(s, cb.transpose(-1, -2)), scale, form)
    elif form == 'release' and not torch.compiler.is_compiling() and not torch.is_autocast_enabled(q.device.type):
        # eager, no autocast (under autocast the products' dtypes differ): one autograd.Function
        out = SegmentCrissCrossRelease.apply(q * scale if scale != 1.0 else q, k, v_in, ca, cb.transpose(-1, -2))
    else:
        out = criss_cross_core(q, k, v_in, lambda s: SegmentMaskedSoftmax.apply(s, ca),
                               lambda s: SegmentMaskedSoftmax.apply(s, cb.transpose(-1, -2)), scale, form)
    return out.to(v.dtype)


def rmt_criss_cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, *,
                              scale: float = 1.0, impl: str = 'auto') -> torch.Tensor:
    """RMT's decomposed attention: rows first, then columns (form ``'h2v'`` of :func:`criss_cross_attention`),
    fixed decay ``log_decay * |d|`` per axis.

    log_decay: (heads,) or (B, heads). The bias is built once per head, (heads, W, W) and (heads, H, H).
    """
    return run('rmt_criss_cross_attention', _rmt_plan, (scale, impl), q, k, v, log_decay)


def _rmt_plan(q, k, v, log_decay, scale: float, impl: str, traced=None):
    """The call that runs :func:`rmt_criss_cross_attention` on inputs like these (checked here); ``traced`` goes to
    the Triton path."""
    check_qkv(q, k, v)
    check_log_decay(log_decay, q)
    requested, impl = impl, resolve_impl(impl, 'rmt_criss_cross_attention', (q, k, v))
    if impl == 'triton':
        from ..triton_support.preflight import triton_plan
        from .triton_impl import criss_cross_attention_triton
        return triton_plan(
            'rmt_criss_cross_attention',
            lambda q, k, v, log_decay: criss_cross_attention_triton(
                q, k, v, *head_decay_tables(log_decay, q.shape[:-1]), scale, 'h2v', 'rmt_criss_cross_attention',
                traced),
            (q, k, v, log_decay), requested, lambda *t: rmt_criss_cross_attention(*t, scale=scale, impl='torch'))
    if impl == 'reference':
        def reference(q, k, v, log_decay):
            decay = head_decay_map(log_decay.to(table_dtype(q, k, v, log_decay)), q.shape[:-1])
            return criss_cross_attention(q, k, v, decay, decay, scale=scale, form='h2v', impl='reference')
        return reference
    return functools.partial(_rmt_torch, scale=scale)


def _rmt_torch(q, k, v, log_decay, scale: float):
    b, heads, h, w, _ = q.shape
    dtype = table_dtype(q, k, v, log_decay)
    sa, sb = manhattan_segment_sums(log_decay, h, w, dtype)
    sa, sb = sa[:, :, :1], sb[:, :, :1]  # one (W, W) and one (H, H) bias per head, broadcast
    q, k, v_in = q.to(dtype), k.to(dtype), v.to(dtype)
    if eager_inference(q, k, v_in, log_decay):
        def head_bias(table):  # (B|1, heads, 1, L, L) -> -inf in the padding of the rows
            table = pad_last(table, padded(table.shape[-1], table.device), float('-inf')).expand(b, -1, -1, -1, -1)
            return lambda s, i0, i1, n0, n1: s.add_(table[i0:i1, n0:n1])
        out = criss_cross_slices(q, k, v_in, head_bias(sa), head_bias(sb), scale, 'h2v')
    elif exporting() and export_loops('criss_cross', h * w):
        out = criss_cross_export(q, k, v_in, (lambda s: s + sa[:, :, 0], ()), (lambda s: s + sb[:, :, 0], ()), scale,
                                 'h2v')
    else:
        out = criss_cross_core(q, k, v_in, lambda s: s.add_(sa).softmax(-1), lambda s: s.add_(sb).softmax(-1), scale,
                               'h2v')
    return out.to(v.dtype)
