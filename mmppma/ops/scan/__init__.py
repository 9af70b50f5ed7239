"""The polyline mask applied without forming it (paper Algorithm 1, Appendix A.7; docs/method.md §4): the 1D
decay scan :func:`decay_scan_1d`, the mask-vector product :func:`polyline_mask_matvec` and the O(N) linear and
decomposed attentions built on it, dispatched to :mod:`.reference` (dense), :mod:`.torch_impl` or
:mod:`.triton_impl`; on the Triton path the linear and decomposed attentions run the fused kernels of
:mod:`.linear_triton` instead (no field of d x d_v states).

The 2D mask factorizes into 1D structured masks: ``L_v2h x`` is a bidirectional decay scan down every column
(``lb``), then along every row (``la``); ``L_h2v x`` is the other order. A bidirectional scan is a symmetric
1-semiseparable product ``y_t = sum_s exp(segsum(t, s)) x_s``. ``((S1 S2^T) * L2D) v`` with a low-rank attention
S1 S2^T is then computed without any N x N tensor: per token form ``S2 (x) v`` (r x d_v), apply the mask to it,
and contract with S1.
"""
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ..checks import check_choice, check_decays, table_dtype
from ..dispatch import resolve_impl
from ..forms import MASK_FORMS
from .reference import decay_scan_reference, decomposed_reference, matvec_reference
from .torch_impl import decay_scan_torch

__all__ = ['decay_scan_1d', 'polyline_mask_matvec', 'ppma_decomposed_attention', 'ppma_linear_attention']

DEFAULT_CHUNK = 64
FEATURE_MAPS = {
    'elu': lambda x: F.elu(x) + 1.0,
    'relu': F.relu,
    'identity': lambda x: x,
}


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
    requested, impl = impl, resolve_impl(impl, 'decay_scan_1d', (x, log_decay))
    if impl == 'triton':
        from ..triton_support.preflight import run_or_fall_back
        from .triton_impl import decay_scan_triton
        return run_or_fall_back('decay_scan_1d', decay_scan_triton, (x, log_decay), requested,
                                lambda *t: decay_scan_1d(*t, impl='torch', chunk=chunk))
    dtype = table_dtype(x, log_decay)
    scan = decay_scan_reference if impl == 'reference' else lambda x, d: decay_scan_torch(x, d, chunk)
    return scan(x.to(dtype), log_decay.to(dtype)).to(x.dtype)


def scan_columns(x: torch.Tensor, lb: torch.Tensor, impl: str, chunk: int) -> torch.Tensor:
    """The scan down every column: x (..., H, W, D), lb (..., H, W)."""
    return decay_scan_1d(x.transpose(-3, -2), lb.transpose(-1, -2), impl=impl, chunk=chunk).transpose(-3, -2)


def polyline_mask_matvec(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, *, form: str = 'v2h',
                         impl: str = 'auto', chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """``L @ x`` for the polyline path mask, without forming L (Algorithm 1).

    x: (B, heads, H, W, D); la, lb: (B, heads, H, W). form ``'v2h'``: L = exp(M) (column scan, then
    row scan); ``'h2v'``: L^T (row scan, then column scan); ``'2d'``: L2D = L + L^T.
    ``impl``: ``'reference'`` forms the dense mask; the others choose the 1D scans' implementation.
    """
    check_choice('form', form, MASK_FORMS)
    check_decays(la, lb)
    if x.dim() != 5 or x.shape[:-1] != la.shape:
        raise ValueError(f'x: expected (B, heads, H, W, D) matching la, lb (B, heads, H, W) = '
                         f'{tuple(la.shape)}; got x {tuple(x.shape)}')
    requested, impl = impl, resolve_impl(impl, 'polyline_mask_matvec', (x, la, lb), form)
    if impl == 'triton':
        from ..triton_support.preflight import run_or_fall_back
        return run_or_fall_back('polyline_mask_matvec', lambda x, la, lb: _matvec(x, la, lb, form, 'triton', chunk),
                                (x, la, lb), requested, lambda *t: _matvec(*t, form, 'torch', chunk))
    return _matvec(x, la, lb, form, impl, chunk)


def _matvec(x, la, lb, form: str, impl: str, chunk: int) -> torch.Tensor:
    """:func:`polyline_mask_matvec` with a resolved ``impl``."""
    if form == '2d':
        return _matvec(x, la, lb, 'v2h', impl, chunk) + _matvec(x, la, lb, 'h2v', impl, chunk)
    if impl == 'reference':
        return matvec_reference(x, la, lb, form)
    if form == 'v2h':
        return decay_scan_1d(scan_columns(x, lb, impl, chunk), la, impl=impl, chunk=chunk)
    return scan_columns(decay_scan_1d(x, la, impl=impl, chunk=chunk), lb, impl, chunk)


def _check(s1, s2, v, la, lb):
    if not (s1.dim() == 5 and s2.shape == s1.shape and v.dim() == 5 and v.shape[:-1] == s1.shape[:-1]
            and la.shape == s1.shape[:-1]):
        raise ValueError('expected s1, s2 (or q, k): (B, heads, H, W, r); v: (B, heads, H, W, d_v); '
                         'la, lb: (B, heads, H, W); got '
                         f'{tuple(s1.shape)}, {tuple(s2.shape)}, {tuple(v.shape)}, {tuple(la.shape)}, '
                         f'{tuple(lb.shape)}')
    check_decays(la, lb)


def product_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype of the fused kernels' products of input tiles: the inputs' when all are float16 or all bfloat16,
    else float32."""
    dtype = tensors[0].dtype
    if dtype in (torch.float16, torch.bfloat16) and all(t.dtype == dtype for t in tensors):
        return dtype
    return torch.float32


def _fused(q, k, v, qn, kn, la, lb, form: str, normalize: bool, eps: float, dtype: torch.dtype, op: str):
    """The fused Triton kernels (:mod:`.linear_triton`) on features q, k (and qn, kn for the normalizer)."""
    from ..masks import decay_tables
    from .linear_triton import linear_attention_triton
    return linear_attention_triton(q, k, v, qn, kn, *decay_tables(la, lb), form, normalize, eps, dtype, op)


def ppma_decomposed_attention(s1: torch.Tensor, s2: torch.Tensor, v: torch.Tensor, la: torch.Tensor,
                              lb: torch.Tensor, *, form: str = '2d', impl: str = 'auto',
                              chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """PPMDA: ``((s1 s2^T) * L) v`` for a low-rank attention map s1 s2^T.

    s1, s2: (B, heads, H, W, r) (the map is s1 @ s2^T over raster-ordered tokens); v: (B, heads, H, W, d_v);
    la, lb: (B, heads, H, W). form: ``'2d'`` (L2D = L + L^T, the paper's), ``'v2h'`` (L) or ``'h2v'`` (L^T).
    """
    check_choice('form', form, MASK_FORMS)
    _check(s1, s2, v, la, lb)
    requested, impl = impl, resolve_impl(impl, 'ppma_decomposed_attention', (s1, s2, v), form)
    if impl == 'triton':
        from ..triton_support.preflight import run_or_fall_back
        return run_or_fall_back('ppma_decomposed_attention',
                                lambda *t: _decomposed(*t, form=form, impl='triton', chunk=chunk), (s1, s2, v, la, lb),
                                requested, lambda *t: _decomposed(*t, form=form, impl='torch', chunk=chunk))
    return _decomposed(s1, s2, v, la, lb, form=form, impl=impl, chunk=chunk)


def _decomposed(s1, s2, v, la, lb, *, form: str, impl: str, chunk: int, out_dtype=None) -> torch.Tensor:
    """:func:`ppma_decomposed_attention` with a resolved ``impl``, computed in float32 (float64 for float64 inputs)
    and returned in ``out_dtype`` (default: v's)."""
    if impl == 'triton':
        return _fused(s1, s2, v, s1, s2, la, lb, form, False, 0.0, product_dtype(s1, s2, v),
                      'ppma_decomposed_attention')
    dtype = table_dtype(s1, s2, v, la, lb)
    out_dtype = out_dtype or v.dtype
    s1f, s2f, vf = s1.to(dtype), s2.to(dtype), v.to(dtype)
    if impl == 'reference':
        return decomposed_reference(s1f, s2f, vf, la.to(dtype), lb.to(dtype), form).to(out_dtype)
    b, heads, h, w, r = s1.shape
    dv = v.shape[-1]
    kv = (s2f.unsqueeze(-1) * vf.unsqueeze(-2)).reshape(b, heads, h, w, r * dv)  # per-token s2 (x) v
    z = polyline_mask_matvec(kv, la, lb, form=form, impl=impl, chunk=chunk).reshape(b, heads, h, w, r, dv)
    return (s1f.unsqueeze(-2) @ z).squeeze(-2).to(out_dtype)


def ppma_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: torch.Tensor,
                          lb: torch.Tensor, *, form: str = '2d', feature_map: Union[None, str, Callable] = None,
                          normalize: bool = False, normalizer: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                          eps: float = 1e-6, impl: str = 'auto', chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """PPMLA (paper Eq. 34): ``((phi(q) phi(k)^T) * L2D) v`` in O(N), never forming N x N.

    q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); la, lb: (B, heads, H, W).
    form: the mask, as :func:`ppma_decomposed_attention` (``'2d'``: L2D).
    feature_map: None / ``'identity'`` (Eq. 34 as written), ``'elu'`` (elu + 1, as MLLA), ``'relu'``, or a
    callable. normalize: divide each output by its masked attention mass ``phi(q_p) . (L2D phi(k))_p``
    (+ eps), as normalized linear attention does; only meaningful for non-negative feature maps.
    normalizer: ``(q', k')`` to take that mass from instead of ``(q, k)`` (same shapes; the feature map
    applies to them too), e.g. MLLA's un-rotated features when q, k carry RoPE, whose products can be
    negative. Only with ``normalize=True``.
    """
    if normalizer is not None and not normalize:
        raise ValueError('normalizer=(q, k) is only used with normalize=True; pass normalize=True or drop it')
    check_choice('form', form, MASK_FORMS)
    _check(q, k, v, la, lb)
    if normalizer is not None and (normalizer[0].shape != q.shape or normalizer[1].shape != k.shape):
        raise ValueError(f'normalizer: expected tensors shaped like q {tuple(q.shape)} and k {tuple(k.shape)}; '
                         f'got {tuple(normalizer[0].shape)} and {tuple(normalizer[1].shape)}')
    if feature_map is None:
        feature_map = 'identity'
    if isinstance(feature_map, str):
        check_choice('feature_map', feature_map, tuple(FEATURE_MAPS))
        feature_map = FEATURE_MAPS[feature_map]

    def attend(impl, q, k, v, la, lb, *normalizer):
        # float32 from the feature maps on (float64 for float64 inputs): in half precision the numerator and the
        # mass can each pass float16's range, and the gradient of a token whose mass is ~0 (features ~0, the
        # output held by eps) is large before the feature map's derivative scales it back down
        dtype = table_dtype(q, k, v, la, lb)
        if impl == 'triton':  # the kernels keep the products' sums, the mass and the division in float32
            if feature_map is FEATURE_MAPS['identity']:  # the inputs as they are: no float32 copies
                fq, fk, fqn, fkn = q, k, *(normalizer or (q, k))
            else:
                fq, fk = feature_map(q.to(dtype)), feature_map(k.to(dtype))
                fqn, fkn = (feature_map(x.to(dtype)) for x in normalizer) if normalizer else (fq, fk)
            return _fused(fq, fk, v, fqn, fkn, la, lb, form, normalize, eps, product_dtype(q, k, v),
                          'ppma_linear_attention')
        fq, fk = feature_map(q.to(dtype)), feature_map(k.to(dtype))
        if not normalize:
            return _decomposed(fq, fk, v, la, lb, form=form, impl=impl, chunk=chunk)
        out = _decomposed(fq, fk, v, la, lb, form=form, impl=impl, chunk=chunk, out_dtype=dtype)
        if normalizer:
            fq, fk = feature_map(normalizer[0].to(dtype)), feature_map(normalizer[1].to(dtype))
        ones = v.new_ones(*v.shape[:-1], 1)
        mass = _decomposed(fq, fk, ones, la, lb, form=form, impl=impl, chunk=chunk, out_dtype=dtype)
        return (out / (mass + eps)).to(v.dtype)

    inputs = (q, k, v, la, lb, *(normalizer or ()))
    requested, impl = impl, resolve_impl(impl, 'ppma_linear_attention', (q, k, v), form)
    if impl == 'triton':
        from ..triton_support.preflight import run_or_fall_back
        return run_or_fall_back('ppma_linear_attention', lambda *t: attend('triton', *t), inputs, requested,
                                lambda *t: attend('torch', *t))
    return attend(impl, *inputs)
