"""Decay scan and the 2-D mask products, dense references: the L x L (or N x N) mask formed and multiplied,
float64 for float64 inputs (the test oracles)."""
import torch

from ..masks import polyline_mask, segment_sum


def decay_scan_reference(x: torch.Tensor, log_decay: torch.Tensor) -> torch.Tensor:
    """``exp(segment_sum(cumsum(log_decay))) @ x``, x and log_decay in the table dtype."""
    return segment_sum(log_decay.cumsum(-1)).exp() @ x


def matvec_reference(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, form: str) -> torch.Tensor:
    """``L @ x`` with the dense mask of ``form``; x (B, heads, H, W, D)."""
    b, heads, h, w, d = x.shape
    lmask = polyline_mask(la, lb, form=form, space='linear')
    return (lmask @ x.to(lmask.dtype).reshape(b, heads, h * w, d)).reshape(x.shape).to(x.dtype)


def decomposed_reference(s1, s2, v, la, lb, form: str) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` with the dense mask of ``form``; all in one float dtype."""
    b, heads, h, w, r = s1.shape
    lmask = polyline_mask(la, lb, form=form, space='linear')
    attn = (s1.reshape(b, heads, h * w, r) @ s2.reshape(b, heads, h * w, r).transpose(-1, -2)) * lmask
    return (attn @ v.reshape(b, heads, h * w, -1)).reshape(*v.shape)
