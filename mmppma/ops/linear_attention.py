"""Polyline-path-masked linear and decomposed attention, O(N) (paper Appendix A.7, Theorem 3).

``((S1 S2^T) * L2D) v`` with a low-rank attention S1 S2^T is computed without any N x N tensor:
per token form ``S2 (x) v`` (r x d_v), apply the mask to it with Algorithm 1
(:func:`polyline_mask_matvec`), and contract with S1. ``reference`` forms the dense mask instead.
"""
from typing import Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ._checks import check_choice, check_decays, table_dtype
from .dispatch import resolve_impl
from .polyline_mask import polyline_mask
from .scan import DEFAULT_CHUNK, MATVEC_FORMS, polyline_mask_matvec

FEATURE_MAPS = {
    'elu': lambda x: F.elu(x) + 1.0,
    'relu': F.relu,
    'identity': lambda x: x,
}


def _check(s1, s2, v, la, lb):
    if not (s1.dim() == 5 and s2.shape == s1.shape and v.dim() == 5 and v.shape[:-1] == s1.shape[:-1]
            and la.shape == s1.shape[:-1]):
        raise ValueError('expected s1, s2 (or q, k): (B, heads, H, W, r); v: (B, heads, H, W, d_v); '
                         'la, lb: (B, heads, H, W); got '
                         f'{tuple(s1.shape)}, {tuple(s2.shape)}, {tuple(v.shape)}, {tuple(la.shape)}, '
                         f'{tuple(lb.shape)}')
    check_decays(la, lb)


def ppma_decomposed_attention(s1: torch.Tensor, s2: torch.Tensor, v: torch.Tensor, la: torch.Tensor,
                              lb: torch.Tensor, *, form: str = '2d', impl: str = 'auto',
                              chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """PPMDA: ``((s1 s2^T) * L) v`` for a low-rank attention map s1 s2^T.

    s1, s2: (B, heads, H, W, r) (the map is s1 @ s2^T over raster-ordered tokens); v: (B, heads, H, W, d_v);
    la, lb: (B, heads, H, W). form: ``'2d'`` (L2D = L + L^T, the paper's), ``'v2h'`` (L) or ``'h2v'`` (L^T).
    """
    check_choice('form', form, MATVEC_FORMS)
    _check(s1, s2, v, la, lb)
    impl = resolve_impl(impl, 'ppma_decomposed_attention', (s1, s2, v))
    dtype = table_dtype(s1, s2, v, la, lb)
    s1f, s2f, vf = s1.to(dtype), s2.to(dtype), v.to(dtype)
    b, heads, h, w, r = s1.shape
    if impl == 'reference':
        lmask = polyline_mask(la.to(dtype), lb.to(dtype), form=form, space='linear')
        attn = (s1f.reshape(b, heads, h * w, r) @ s2f.reshape(b, heads, h * w, r).transpose(-1, -2)) * lmask
        return (attn @ vf.reshape(b, heads, h * w, -1)).reshape(*v.shape).to(v.dtype)
    dv = v.shape[-1]
    kv = (s2f.unsqueeze(-1) * vf.unsqueeze(-2)).reshape(b, heads, h, w, r * dv)  # per-token s2 (x) v
    z = polyline_mask_matvec(kv, la, lb, form=form, impl=impl, chunk=chunk).reshape(b, heads, h, w, r, dv)
    return (s1f.unsqueeze(-2) @ z).squeeze(-2).to(v.dtype)


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
    check_choice('form', form, MATVEC_FORMS)
    _check(q, k, v, la, lb)
    if normalizer is not None and (normalizer[0].shape != q.shape or normalizer[1].shape != k.shape):
        raise ValueError(f'normalizer: expected tensors shaped like q {tuple(q.shape)} and k {tuple(k.shape)}; '
                         f'got {tuple(normalizer[0].shape)} and {tuple(normalizer[1].shape)}')
    if feature_map is None:
        feature_map = 'identity'
    if isinstance(feature_map, str):
        check_choice('feature_map', feature_map, tuple(FEATURE_MAPS))
        feature_map = FEATURE_MAPS[feature_map]
    fq, fk = feature_map(q), feature_map(k)
    out = ppma_decomposed_attention(fq, fk, v, la, lb, form=form, impl=impl, chunk=chunk)
    if not normalize:
        return out
    if normalizer is not None:
        fq, fk = feature_map(normalizer[0]), feature_map(normalizer[1])
    ones = v.new_ones(*v.shape[:-1], 1)
    mass = ppma_decomposed_attention(fq, fk, ones, la, lb, form=form, impl=impl, chunk=chunk)
    return out / (mass + eps)
