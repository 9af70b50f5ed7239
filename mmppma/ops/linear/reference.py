"""PPMLA and PPMDA, dense reference: ``((s1 s2^T) * L) v`` with the N x N mask formed, float64 for float64 inputs
(the test oracle); the feature maps and the normalization that the reference and torch paths share."""
import functools
from typing import Callable

import torch
import torch.nn.functional as F

from ..checks import table_dtype
from ..masks import polyline_mask

#: the named feature maps of :func:`~mmppma.ops.ppma_linear_attention`
FEATURE_MAPS = {
    'elu': lambda x: F.elu(x) + 1.0,
    'relu': F.relu,
    'identity': lambda x: x,
}


def decomposed_reference(s1, s2, v, la, lb, form: str) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` with the dense mask of ``form``; all in one float dtype."""
    b, heads, h, w, r = s1.shape
    lmask = polyline_mask(la.to(s1.dtype), lb.to(s1.dtype), form=form, space='linear')
    attn = (s1.reshape(b, heads, h * w, r) @ s2.reshape(b, heads, h * w, r).transpose(-1, -2)) * lmask
    return (attn @ v.reshape(b, heads, h * w, -1)).reshape(*v.shape)


def decomposed(core: Callable[..., torch.Tensor], s1, s2, v, la, lb, out_dtype=None) -> torch.Tensor:
    """PPMDA on ``core(s1, s2, v, la, lb)`` (the dense or the scan form), computed in float32 (float64 for float64
    inputs) and returned in ``out_dtype`` (default: v's)."""
    dtype = table_dtype(s1, s2, v, la, lb)
    return core(s1.to(dtype), s2.to(dtype), v.to(dtype), la, lb).to(out_dtype or v.dtype)


def linear(core: Callable[..., torch.Tensor], feature_map: Callable, normalize: bool, eps: float, q, k, v, la, lb,
           *normalizer) -> torch.Tensor:
    """PPMLA on ``core`` as :func:`decomposed` takes it: the features, the masked product and (``normalize``) its
    division by the masked attention mass, of the ``normalizer`` features when given."""
    # float32 from the feature maps on (float64 for float64 inputs): in half precision the numerator and the
    # mass can each pass float16's range, and the gradient of a token whose mass is ~0 (features ~0, the
    # output held by eps) is large before the feature map's derivative scales it back down
    dtype = table_dtype(q, k, v, la, lb)
    fq, fk = feature_map(q.to(dtype)), feature_map(k.to(dtype))
    if not normalize:
        return decomposed(core, fq, fk, v, la, lb)
    out = decomposed(core, fq, fk, v, la, lb, dtype)
    if normalizer:
        fq, fk = feature_map(normalizer[0].to(dtype)), feature_map(normalizer[1].to(dtype))
    ones = v.new_ones(*v.shape[:-1], 1)
    mass = decomposed(core, fq, fk, ones, la, lb, dtype)
    return (out / (mass + eps)).to(v.dtype)


def ppma_decomposed_attention_plan(s1, s2, v, la, lb, form: str, chunk: int):
    """The reference path of :func:`~mmppma.ops.ppma_decomposed_attention` (:class:`~mmppma.ops.plan.Op`)."""
    return functools.partial(decomposed, functools.partial(decomposed_reference, form=form))


def ppma_linear_attention_plan(q, k, v, la, lb, *normalizer_and_options):
    """The reference path of :func:`~mmppma.ops.ppma_linear_attention`: ``normalizer_and_options`` are the
    normalizer's q', k' (when given), then form, feature_map, normalize, eps, chunk."""
    *_, form, feature_map, normalize, eps, chunk = normalizer_and_options
    return functools.partial(linear, functools.partial(decomposed_reference, form=form), feature_map, normalize, eps)
