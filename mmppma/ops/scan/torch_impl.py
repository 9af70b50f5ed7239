"""Decay scan, torch path: the bidirectional scan as a causal chunkwise scan (Mamba2's SSD: dense tiles inside
chunks, a scan of chunk states between them, O(L) in time and memory) plus the same scan of the reversed line."""
import torch
import torch.nn.functional as F

from ..dispatch import exporting
from ..masks import segment_sum


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
