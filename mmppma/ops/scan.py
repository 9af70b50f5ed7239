"""Applying a polyline path mask to a vector without forming it (paper Algorithm 1, docs/method.md §4).

The 2D mask factorizes into 1D structured masks: ``L_v2h x`` is a bidirectional decay scan down every
column (``lb``), then along every row (``la``); ``L_h2v x`` is the other order. A bidirectional scan is a
symmetric 1-semiseparable product ``y_t = sum_s exp(segsum(t, s)) x_s``. Short lines use one dense
L x L tile; long lines use the chunkwise algorithm of Mamba2's SSD (dense tiles inside chunks, a scan of
chunk states between them), which is O(L) in time and memory.
"""
import torch
import torch.nn.functional as F

from ._checks import check_choice, check_decays, table_dtype
from .dispatch import resolve_impl
from .polyline_mask import polyline_mask, polyline_mask_3d, segment_sum

DEFAULT_CHUNK = 64
MATVEC_FORMS = ('v2h', 'h2v', '2d')


def _causal_chunked_scan(x: torch.Tensor, a: torch.Tensor, chunk: int) -> torch.Tensor:
    """``y_t = sum_{s<=t} exp(sum_{u=s+1..t} a_u) x_s``. x: (..., L, D), a: (..., L), float32/64."""
    length = a.shape[-1]
    pad = (-length) % chunk
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
        a = F.pad(a, (0, pad))
    n = a.shape[-1] // chunk
    xc = x.reshape(*x.shape[:-2], n, chunk, x.shape[-1])
    c = a.reshape(*a.shape[:-1], n, chunk).cumsum(-1)  # cumsum inside each chunk
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=a.device).tril()
    tile = torch.where(causal, segment_sum(c), torch.full((), float('-inf'), dtype=c.dtype, device=c.device))
    y = tile.exp() @ xc  # contributions from inside the chunk
    # state leaving each chunk, and the decay across each whole chunk
    states = ((c[..., -1:] - c).exp().unsqueeze(-1) * xc).sum(-2)  # (..., n, D)
    g = c[..., -1].cumsum(-1)  # (..., n)
    # state entering chunk m: sum_{m' < m} exp(g[m-1] - g[m']) states[m']
    strict = torch.ones(n, n, dtype=torch.bool, device=a.device).tril(-1)
    g_prev = F.pad(g, (1, 0))[..., :-1]  # g[m-1], with g[-1] = 0
    across = torch.where(strict, (g_prev.unsqueeze(-1) - g.unsqueeze(-2)),
                         torch.full((), float('-inf'), dtype=g.dtype, device=g.device))
    incoming = across.exp() @ states  # (..., n, D)
    y = y + c.exp().unsqueeze(-1) * incoming.unsqueeze(-2)
    y = y.reshape(*x.shape[:-2], n * chunk, x.shape[-1])
    return y[..., :length, :]


def decay_scan_1d(x: torch.Tensor, log_decay: torch.Tensor, *, impl: str = 'auto',
                  chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Bidirectional 1D decay scan ``y_t = sum_s exp(segsum(t, s)) x_s`` along the second-last dim of x.

    x: (..., L, D); log_decay: (..., L) per-token log-decays (<= 0). Computed in float32 at least; returns
    x's dtype. ``torch``: lines up to ``chunk`` long use one dense tile, longer ones the O(L) chunkwise scan;
    ``reference``: the dense L x L mask; ``triton``: a tiled kernel.
    """
    if x.dim() < 2 or log_decay.shape != x.shape[:-1]:
        raise ValueError(f'decay_scan_1d: expected x (..., L, D) and log_decay (..., L); got x {tuple(x.shape)}, '
                         f'log_decay {tuple(log_decay.shape)}')
    if not log_decay.is_floating_point() or log_decay.is_complex():
        raise ValueError(f'decay_scan_1d: log_decay must be a real floating point tensor; got {log_decay.dtype}')
    impl = resolve_impl(impl, 'decay_scan_1d', (x, log_decay))
    if impl == 'triton':
        from .triton.decay_scan import decay_scan_triton
        return decay_scan_triton(x, log_decay)
    dtype = table_dtype(x, log_decay)
    xf, af = x.to(dtype), log_decay.to(dtype)
    if impl == 'reference' or af.shape[-1] <= chunk:
        y = segment_sum(af.cumsum(-1)).exp() @ xf
    else:
        forward = _causal_chunked_scan(xf, af, chunk)
        # the anti-causal half is the causal scan of the reversed line, whose log-decays shift by one:
        # the segment s..t (s > t) uses a_{t+1..s}
        a_rev = F.pad(af.flip(-1)[..., :-1], (1, 0))
        backward = _causal_chunked_scan(xf.flip(-2), a_rev, chunk).flip(-2)
        y = forward + backward - xf
    return y.to(x.dtype)


def _scan_columns(x: torch.Tensor, lb: torch.Tensor, impl: str, chunk: int) -> torch.Tensor:
    """The scan down every column: x (..., H, W, D), lb (..., H, W)."""
    return decay_scan_1d(x.transpose(-3, -2), lb.transpose(-1, -2), impl=impl, chunk=chunk).transpose(-3, -2)


def polyline_mask_matvec(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, *, form: str = 'v2h',
                         impl: str = 'auto', chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """``L @ x`` for the polyline path mask, without forming L (Algorithm 1).

    x: (B, heads, H, W, D); la, lb: (B, heads, H, W). form ``'v2h'``: L = exp(M) (column scan, then
    row scan); ``'h2v'``: L^T (row scan, then column scan); ``'2d'``: L2D = L + L^T.
    ``impl``: ``'reference'`` forms the dense mask; the others choose the 1D scans' implementation.
    """
    check_choice('form', form, MATVEC_FORMS)
    check_decays(la, lb)
    if x.dim() != 5 or x.shape[:-1] != la.shape:
        raise ValueError(f'x: expected (B, heads, H, W, D) matching la, lb (B, heads, H, W) = '
                         f'{tuple(la.shape)}; got x {tuple(x.shape)}')
    if form == '2d':
        return (polyline_mask_matvec(x, la, lb, form='v2h', impl=impl, chunk=chunk) +
                polyline_mask_matvec(x, la, lb, form='h2v', impl=impl, chunk=chunk))
    if resolve_impl(impl, 'polyline_mask_matvec', (x, la, lb)) == 'reference':
        b, heads, h, w, d = x.shape
        lmask = polyline_mask(la, lb, form=form, space='linear')
        return (lmask @ x.to(lmask.dtype).reshape(b, heads, h * w, d)).reshape(x.shape).to(x.dtype)
    if form == 'v2h':
        return decay_scan_1d(_scan_columns(x, lb, impl, chunk), la, impl=impl, chunk=chunk)
    return _scan_columns(decay_scan_1d(x, la, impl=impl, chunk=chunk), lb, impl, chunk)


def polyline_mask_matvec_3d(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, lc: torch.Tensor, *,
                            impl: str = 'auto', chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """``L3D @ x`` for the 3D polyline path mask (Appendix C.2) without forming it: a depth scan
    (``lc``), then a vertical scan (``lb``), then a horizontal scan (``la``).

    x: (B, heads, D, H, W, C); la, lb, lc: (B, heads, D, H, W). Matches :func:`polyline_mask_3d`.
    """
    if not (la.dim() == 5 and la.shape == lb.shape == lc.shape and x.dim() == 6 and x.shape[:-1] == la.shape):
        raise ValueError('expected x (B, heads, D, H, W, C) and la, lb, lc (B, heads, D, H, W); got '
                         f'x {tuple(x.shape)}, la {tuple(la.shape)}, lb {tuple(lb.shape)}, lc {tuple(lc.shape)}')
    for name, t in (('la', la), ('lb', lb), ('lc', lc)):
        if not t.is_floating_point() or t.is_complex():
            raise ValueError(f'{name}: log-decays must be real floating point tensors; got {t.dtype}')
    if resolve_impl(impl, 'polyline_mask_matvec_3d', (x, la, lb, lc)) == 'reference':
        lmask = polyline_mask_3d(la, lb, lc, space='linear')
        flat = x.to(lmask.dtype).reshape(*x.shape[:2], -1, x.shape[-1])
        return (lmask @ flat).reshape(x.shape).to(x.dtype)
    y = decay_scan_1d(x.movedim(2, 4), lc.movedim(2, 4), impl=impl, chunk=chunk).movedim(4, 2)  # along D
    return decay_scan_1d(_scan_columns(y, lb, impl, chunk), la, impl=impl, chunk=chunk)  # along H, then W
