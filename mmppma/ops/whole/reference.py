"""Whole attention, dense reference: the N x N log-mask added to (or, form 'paper', multiplied onto) the
scores, float64 for float64 inputs - the test oracle, and the torch path of form 'paper'; the reference paths of
:func:`~mmppma.ops.ppma_attention` and :func:`~mmppma.ops.manhattan_attention`."""
import torch

from ..checks import table_dtype
from ..forms import paths
from ..masks import manhattan_decay_mask, on_decays, polyline_mask
from ..torch_support import flatten


def whole_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor, scale: float,
                    form: str) -> torch.Tensor:
    """Whole attention of ``form`` with the dense V2H log-mask ``m`` (B|1, heads, N, N)."""
    dtype = table_dtype(q, k, v, m)
    qf, kf, vf = flatten(q).to(dtype), flatten(k).to(dtype), flatten(v).to(dtype)
    s = (qf @ kf.transpose(-1, -2)) * scale
    m = m.to(dtype)
    if form == 'paper':
        attn = s.softmax(-1) * (m.exp() + m.transpose(-1, -2).exp())
    else:
        names = paths(form)
        attn = sum((s + (m if path == 'v2h' else m.transpose(-1, -2))).softmax(-1) for path in names) / len(names)
    return (attn @ vf).reshape(*v.shape).to(v.dtype)


def ppma_attention_plan(q, k, v, la, lb, scale: float, form: str, tables: bool):
    """The reference path of :func:`~mmppma.ops.ppma_attention` (:class:`~mmppma.ops.plan.Op`): the dense mask."""
    return on_decays(lambda q, k, v, la, lb: whole_reference(q, k, v, polyline_mask(la, lb, form='v2h'), scale, form),
                     tables)


def manhattan_attention_plan(q, k, v, log_decay, scale: float):
    """The reference path of :func:`~mmppma.ops.manhattan_attention`: the dense Manhattan mask."""
    b, heads, h, w, _ = q.shape
    dtype = table_dtype(q, k, v, log_decay)

    def dense(q, k, v, log_decay):
        m = manhattan_decay_mask(log_decay.to(dtype), h, w)
        m = m if m.dim() == 4 else m.unsqueeze(0)
        return whole_reference(q, k, v, m.expand(b, -1, -1, -1), scale, 'v2h')
    return dense
