"""Criss-cross attention, dense reference: row attention A_w and column attention A_h embedded in block-sparse
N x N form, their biases the V2H mask restricted to a row (the row segment sums) or a column, composed by matrix
products; float64 for float64 inputs (the test oracle)."""
import torch

from ..checks import table_dtype
from ..masks import head_decay_map, on_decays, polyline_mask
from ..torch_support import flatten


def criss_cross_reference(q, k, v, la, lb, scale: float, form: str) -> torch.Tensor:
    dtype = table_dtype(q, k, v, la, lb)
    h, w = q.shape[2:4]
    n = h * w
    qf, kf, vf = flatten(q).to(dtype), flatten(k).to(dtype), flatten(v).to(dtype)
    s = (qf @ kf.transpose(-1, -2)) * scale
    ii = torch.arange(n, device=q.device) // w
    jj = torch.arange(n, device=q.device) % w
    m = s + polyline_mask(la.to(dtype), lb.to(dtype), form='v2h')
    neg_inf = torch.full((), float('-inf'), dtype=dtype, device=q.device)
    a_rows = torch.where(ii[:, None] == ii[None, :], m, neg_inf).softmax(-1)
    a_cols = torch.where(jj[:, None] == jj[None, :], m, neg_inf).softmax(-1)
    rows_first = a_cols @ (a_rows @ vf)  # 'h2v'
    cols_first = a_rows @ (a_cols @ vf)  # 'v2h'
    out = {'h2v': rows_first, 'v2h': cols_first, 'release': 0.5 * rows_first + 0.5 * cols_first}[form]
    return out.reshape(*v.shape)


def criss_cross_attention_plan(q, k, v, la, lb, scale: float, form: str, tables: bool):
    """The reference path of :func:`~mmppma.ops.criss_cross_attention` (:class:`~mmppma.ops.plan.Op`)."""
    return on_decays(lambda q, k, v, la, lb: criss_cross_reference(q, k, v, la, lb, scale, form).to(v.dtype), tables)


def rmt_criss_cross_attention_plan(q, k, v, log_decay, scale: float):
    """The reference path of :func:`~mmppma.ops.rmt_criss_cross_attention`: the fixed decay as a per-token map,
    rows first (form 'h2v')."""
    def dense(q, k, v, log_decay):
        decay = head_decay_map(log_decay.to(table_dtype(q, k, v, log_decay)), q.shape[:-1])
        return criss_cross_reference(q, k, v, decay, decay, scale, 'h2v').to(v.dtype)
    return dense
