"""Whole attention, dense reference: the N x N log-mask added to (or, form 'paper', multiplied onto) the
scores, float64 for float64 inputs - the test oracle, and the torch path of form 'paper'."""
import torch

from ..checks import table_dtype
from ..forms import paths
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
