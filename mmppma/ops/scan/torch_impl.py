"""Decay scan, torch path: the bidirectional scan as a causal chunkwise scan (Mamba2's SSD: dense tiles inside
chunks, a scan of chunk states between them, O(L) in time and memory) plus the same scan of the reversed line; the
mask-vector product composed of 1D scans (:func:`matvec`, Algorithm 1), which the Triton path runs on its scans."""
import functools
from typing import Callable

import torch
import torch.nn.functional as F

from ..export import exporting
from ..masks import segment_sum
from .reference import in_table_dtype


def _causal_chunked_scan(x: torch.Tensor, log_decay: torch.Tensor, chunk: int) -> torch.Tensor:
    """``y_t = sum_{s<=t} exp(sum_{u=s+1..t} log_decay_u) x_s``. x: (..., L, D), log_decay: (..., L),
    float32/64."""
    length = log_decay.shape[-1]
    pad = (-length) % chunk
    if exporting() or pad:  # an export pads always (by 0 at a multiple): skipped at the traced length, it would
        # be left out of the file, whose reshapes then fail at lengths that are not multiples of chunk
        x = F.pad(x, (0, 0, 0, pad))
        log_decay = F.pad(log_decay, (0, pad))
    n = log_decay.shape[-1] // chunk
    xc = x.reshape(*x.shape[:-2], n, chunk, x.shape[-1])
    c = log_decay.reshape(*log_decay.shape[:-1], n, chunk).cumsum(-1)  # the decay table inside each chunk
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=c.device).tril()
    tile = torch.where(causal, segment_sum(c), torch.full((), float('-inf'), dtype=c.dtype, device=c.device))
    y = tile.exp() @ xc  # contributions from inside the chunk
    # state leaving each chunk, and the decay table across whole chunks
    states = ((c[..., -1:] - c).exp().unsqueeze(-1) * xc).sum(-2)  # (..., n, D)
    c_chunks = c[..., -1].cumsum(-1)  # (..., n)
    # state entering chunk m: sum_{m' < m} exp(c_chunks[m-1] - c_chunks[m']) states[m']
    strict = torch.ones(n, n, dtype=torch.bool, device=c.device).tril(-1)
    c_prev = F.pad(c_chunks, (1, 0))[..., :-1]  # c_chunks[m-1], with c_chunks[-1] = 0
    across = torch.where(strict, (c_prev.unsqueeze(-1) - c_chunks.unsqueeze(-2)),
                         torch.full((), float('-inf'), dtype=c.dtype, device=c.device))
    incoming = across.exp() @ states  # (..., n, D)
    y = y + c.exp().unsqueeze(-1) * incoming.unsqueeze(-2)
    y = y.reshape(*x.shape[:-2], n * chunk, x.shape[-1])
    return y[..., :length, :]


def decay_scan_torch(x: torch.Tensor, log_decay: torch.Tensor, chunk: int) -> torch.Tensor:
    """The bidirectional scan of :func:`~mmppma.ops.decay_scan_1d`, x and log_decay in the table dtype: lines up
    to ``chunk`` long as one dense tile, longer ones chunkwise."""
    if log_decay.shape[-1] <= chunk:
        return segment_sum(log_decay.cumsum(-1)).exp() @ x
    forward = _causal_chunked_scan(x, log_decay, chunk)
    # the anti-causal half is the causal scan of the reversed line, whose log-decays shift by one:
    # the segment s..t (s > t) uses log_decay_{t+1..s}
    reversed_decay = F.pad(log_decay.flip(-1)[..., :-1], (1, 0))
    backward = _causal_chunked_scan(x.flip(-2), reversed_decay, chunk).flip(-2)
    return forward + backward - x


def scan_torch(x: torch.Tensor, log_decay: torch.Tensor, chunk: int) -> torch.Tensor:
    """:func:`~mmppma.ops.decay_scan_1d` on the torch path: in the table dtype, returned in x's."""
    return in_table_dtype(decay_scan_torch, x, log_decay, chunk)


def scan_columns(scan: Callable[..., torch.Tensor], x: torch.Tensor, lb: torch.Tensor) -> torch.Tensor:
    """The 1D ``scan(x, log_decay)`` down every column: x (..., H, W, D), lb (..., H, W)."""
    return scan(x.transpose(-3, -2), lb.transpose(-1, -2)).transpose(-3, -2)


def matvec(scan: Callable[..., torch.Tensor], x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor,
           form: str) -> torch.Tensor:
    """``L @ x`` for the mask of ``form`` as Algorithm 1 composes it from the 1D ``scan(x, log_decay)`` (the torch
    or the Triton one): V2H a scan down every column, then along every row; H2V the other order; '2d' their sum."""
    if form == '2d':
        return matvec(scan, x, la, lb, 'v2h') + matvec(scan, x, la, lb, 'h2v')
    if form == 'v2h':
        return scan(scan_columns(scan, x, lb), la)
    return scan_columns(scan, scan(x, la), lb)


def decay_scan_1d_plan(x, log_decay, chunk: int):
    """The torch path of :func:`~mmppma.ops.decay_scan_1d` (:class:`~mmppma.ops.plan.Op`)."""
    return functools.partial(scan_torch, chunk=chunk)


def polyline_mask_matvec_plan(x, la, lb, form: str, chunk: int):
    """The torch path of :func:`~mmppma.ops.polyline_mask_matvec`: Algorithm 1 on the chunkwise scan."""
    return functools.partial(matvec, functools.partial(scan_torch, chunk=chunk), form=form)
