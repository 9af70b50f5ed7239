"""Decay tables and the dense polyline path mask (docs/method.md §2), plus RMT's fixed Manhattan decay mask.

Notation: ``la`` (horizontal) and ``lb`` (vertical) are log-decays of shape (B, heads, H, W), <= 0.
``Ca = cumsum(la)`` along each row, ``Cb = cumsum(lb)`` along each column. The log-decay of a 1D segment
from index s to t is the *segment sum* ``C[t] - C[s]`` taken in index order (``C[max] - C[min]``): the sum of
the log-decays strictly after the start and up to the end. This is the release's convention, including its
gradient; for log-decays <= 0 it equals ``-|C[t] - C[s]|``.

V2H mask between query (i, j) and key (k, l): ``M = Sa(i; j, l) + Sb(l; i, k)`` (along the query's row,
then the key's column). H2V is its transpose. Every entry is O(1) from the O(N) cumsum tables;
:func:`polyline_mask` materializes the mask densely (tests, small inputs) or the rows of given queries.
"""
from typing import Callable, Optional, Sequence, Tuple, Union

import torch

from .checks import check_choice, check_decays, table_dtype
from .forms import MASK_FORMS


def decay_tables(la: torch.Tensor, lb: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row and column cumsums ``(Ca, Cb)``, both (B, heads, H, W), in float32 (float64 for float64 input),
    whatever the input dtype: fp16/bf16 cumsums lose the small decays that matter."""
    dtype = table_dtype(la, lb)
    return la.to(dtype).cumsum(-1), lb.to(dtype).cumsum(-2)


def table_decays(ca: torch.Tensor, cb: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The log-decays (la, lb) whose :func:`decay_tables` are (Ca, Cb): differences along rows and columns."""
    return (torch.diff(ca, dim=-1, prepend=torch.zeros_like(ca[..., :1])),
            torch.diff(cb, dim=-2, prepend=torch.zeros_like(cb[..., :1, :])))


def on_tables(path: Callable[..., torch.Tensor], tables: bool) -> Callable[..., torch.Tensor]:
    """An op of (q, k, v, la, lb) from ``path(q, k, v, ca, cb)`` on decay tables: with ``tables`` la, lb are the
    tables (the path itself), else their :func:`decay_tables` are taken first."""
    if tables:
        return path
    return lambda q, k, v, la, lb: path(q, k, v, *decay_tables(la, lb))


def on_decays(path: Callable[..., torch.Tensor], tables: bool) -> Callable[..., torch.Tensor]:
    """An op of (q, k, v, la, lb) from ``path(q, k, v, la, lb)`` on log-decays: with ``tables`` la, lb are decay
    tables, whose :func:`table_decays` are taken first, else the path itself."""
    if not tables:
        return path
    return lambda q, k, v, ca, cb: path(q, k, v, *table_decays(ca, cb))


def segment_sum(c: torch.Tensor) -> torch.Tensor:
    """``out[..., t, s] = c[..., max(t,s)] - c[..., min(t,s)]`` for a cumsum ``c`` (..., L) -> (..., L, L)."""
    return (c.unsqueeze(-1) - c.unsqueeze(-2)) * sign_table(c.shape[-1], c.dtype, c.device)


def sign_table(n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """+1 on and below the diagonal, -1 above: (n, n), the sign of a segment sum in index order."""
    return torch.ones(n, n, dtype=dtype, device=device).tril().mul_(2).sub_(1)


def row_segment_sums(la: torch.Tensor) -> torch.Tensor:
    """``Sa[b, h, i, j, l]``: log-decay from column j to column l along row i. (B, heads, H, W, W)."""
    return segment_sum(decay_tables(la, la)[0])


def column_segment_sums(lb: torch.Tensor) -> torch.Tensor:
    """``Sb[b, h, l, i, k]``: log-decay from row i to row k along column l. (B, heads, W, H, H)."""
    return segment_sum(decay_tables(lb, lb)[1].transpose(-1, -2))


def v2h_log_mask(sa: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """Dense V2H log-mask (B, heads, N, N) by broadcasting the segment-sum tables (no 6-D repeat).

    sa: (B, heads, H, W, W) as from :func:`row_segment_sums`; sb: (B, heads, W, H, H).
    """
    b, h, hh, ww, _ = sa.shape
    # M[i, j, k, l] = Sa[i, j, l] + Sb[l, i, k]
    m = sa.unsqueeze(-2) + sb.permute(0, 1, 3, 4, 2).unsqueeze(3)
    return m.reshape(b, h, hh * ww, hh * ww)


def _segment(c_t: torch.Tensor, c_s: torch.Tensor, t_ge_s: torch.Tensor) -> torch.Tensor:
    """``c[max(t, s)] - c[min(t, s)]`` from the table values at t and s."""
    return torch.where(t_ge_s, c_t - c_s, c_s - c_t)


def _mask_rows(la: torch.Tensor, lb: torch.Tensor, queries: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows ``M[p, :]`` and ``M^T[p, :]`` for raster query indices p (Q,), each (B, heads, Q, H, W), in O(Q N)."""
    ca, cb = decay_tables(la, lb)  # (B, heads, H, W)
    h, w = la.shape[-2:]
    i, j = queries // w, queries % w  # query (i, j), (Q,)
    iq, jq = i[:, None, None], j[:, None, None]
    k = torch.arange(h, device=la.device)[:, None]  # key (k, l)
    col = torch.arange(w, device=la.device)[None, :]
    c_q = (ca[:, :, i, j][..., None, None], cb[:, :, i, j][..., None, None])  # (B, heads, Q, 1, 1)
    # V2H: along the query's row i from column j to l, then down column l from row i to k
    v2h = (_segment(c_q[0], ca[:, :, i, None, :], jq >= col) +
           _segment(cb[:, :, i, None, :], cb[:, :, None], iq >= k))
    # H2V: along the key's row k from column l to j, then down column j from row k to i
    ca_kj, cb_kj = (t[:, :, :, j].transpose(-1, -2)[..., None] for t in (ca, cb))  # [k, j_q]: (B, heads, Q, H, 1)
    h2v = _segment(ca[:, :, None], ca_kj, col >= jq) + _segment(cb_kj, c_q[1], k >= iq)
    return v2h, h2v


def polyline_mask(la: torch.Tensor, lb: torch.Tensor, *, form: str = 'v2h', space: str = 'log',
                  queries: Optional[Union[Sequence[int], torch.Tensor]] = None) -> torch.Tensor:
    """The dense polyline path mask, (B, heads, H*W, H*W), raster order ``p = i*W + j``.

    form: ``'v2h'`` (M), ``'h2v'`` (M^T) or ``'2d'`` (both paths: L2D = exp(M) + exp(M^T)).
    space: ``'log'`` returns M, M^T or log(L2D); ``'linear'`` returns L = exp(M), L^T or L2D.
    queries: raster indices of the query rows to return, (B, heads, Q, H*W), computed in O(Q N) from the
    decay tables; default all rows, O(N^2) memory: a test oracle and a tool for small maps, not for models.
    """
    check_choice('form', form, MASK_FORMS)
    check_choice('space', space, ('log', 'linear'))
    check_decays(la, lb)
    if queries is not None:
        n = la.shape[-1] * la.shape[-2]
        queries = torch.as_tensor(queries, dtype=torch.long, device=la.device).reshape(-1)
        if len(queries) and not (0 <= int(queries.min()) and int(queries.max()) < n):
            raise ValueError(f'queries: raster indices i*W + j must lie in [0, {n}) for an H x W = '
                             f'{la.shape[-2]} x {la.shape[-1]} map; got {queries.tolist()}')
        v2h, h2v = (t.flatten(-2) for t in _mask_rows(la, lb, queries))
        m = {'v2h': v2h, 'h2v': h2v}[form] if form != '2d' else torch.logaddexp(v2h, h2v)
        return m if space == 'log' else m.exp()
    m = v2h_log_mask(row_segment_sums(la), column_segment_sums(lb))
    if form == 'h2v':
        m = m.transpose(-1, -2)
    elif form == '2d':
        m = torch.logaddexp(m, m.transpose(-1, -2))
    return m if space == 'log' else m.exp()


def manhattan_decay_mask(log_decay: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """RMT's fixed 2D decay in log space: ``log_decay * (|i - k| + |j - l|)``.

    log_decay: (heads,) or (B, heads) -> (heads, N, N) or (B, heads, N, N).
    """
    rows = torch.arange(height, device=log_decay.device, dtype=log_decay.dtype)
    cols = torch.arange(width, device=log_decay.device, dtype=log_decay.dtype)
    ii, jj = torch.meshgrid(rows, cols, indexing='ij')
    ii, jj = ii.reshape(-1), jj.reshape(-1)
    dist = (ii[:, None] - ii[None, :]).abs() + (jj[:, None] - jj[None, :]).abs()
    return log_decay[..., None, None] * dist


def line_distance(length: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """``|t - s|`` for a 1D line of ``length`` tokens, (length, length)."""
    idx = torch.arange(length, device=device, dtype=dtype)
    return (idx[:, None] - idx[None, :]).abs()


def head_decay_map(log_decay: torch.Tensor, shape) -> torch.Tensor:
    """RMT's fixed decay, (heads,) or (B|1, heads), as a per-token log-decay map of ``shape`` (B, heads, H, W)."""
    log_decay = log_decay if log_decay.dim() == 2 else log_decay.unsqueeze(0)
    return log_decay[:, :, None, None].expand(*shape)


def head_decay_tables(log_decay: torch.Tensor, shape) -> Tuple[torch.Tensor, torch.Tensor]:
    """float32 :func:`decay_tables` of RMT's fixed per-head decay on a (B, heads, H, W) grid (the Triton paths)."""
    decay = head_decay_map(log_decay.float(), shape)
    return decay_tables(decay, decay)


def manhattan_segment_sums(log_decay: torch.Tensor, h: int, w: int, dtype: torch.dtype):
    """(Sa, Sb) segment-sum tables of RMT's Manhattan mask, as :func:`row_segment_sums` and
    :func:`column_segment_sums` lay them out, broadcast over the batch (B|1) and the lines; log_decay (heads,) or
    (B, heads), checked."""
    log_decay = (log_decay if log_decay.dim() == 2 else log_decay.unsqueeze(0)).to(dtype)[:, :, None, None, None]
    sa = log_decay * line_distance(w, log_decay.device, dtype)[None, None, None]  # (B|1, heads, 1, W, W)
    sb = log_decay * line_distance(h, log_decay.device, dtype)[None, None, None]  # (B|1, heads, 1, H, H)
    return sa.expand(-1, -1, h, -1, -1), sb.expand(-1, -1, w, -1, -1)
