"""PPMLA and PPMDA, the O(N) linear and decomposed attentions under the polyline mask (docs/method.md §5):
:func:`ppma_linear_attention` and :func:`ppma_decomposed_attention`, dispatched (:mod:`mmppma.ops.plan`) to
:mod:`.reference` (dense), :mod:`.torch_impl` (the mask applied by Algorithm 1's scans, :mod:`mmppma.ops.scan`, or
on large maps the chunked form of :mod:`.chunked`) or :mod:`.triton_impl` (fused dense kernels, the mask built from
the tables: no field of d x d_v states).

``((S1 S2^T) * L2D) v`` with a low-rank attention S1 S2^T is computed without any N x N tensor: per token form
``S2 (x) v`` (r x d_v), apply the mask to it, and contract with S1.
"""
from typing import Callable, Optional, Tuple, Union

import torch

from mmppma.utils.checks import check_choice

from ..checks import check_decomposed, check_linear
from ..devices import triton_available
from ..plan import Op, run
from ..scan import DEFAULT_CHUNK
from . import reference, torch_impl
from .reference import FEATURE_MAPS

if triton_available():  # the Triton paths import triton
    from . import triton_impl
else:  # no implementation resolves to 'triton' (plan.resolve_impl)
    triton_impl = None

__all__ = ['ppma_decomposed_attention', 'ppma_linear_attention']


PPMA_DECOMPOSED_ATTENTION = Op('ppma_decomposed_attention', check_decomposed, reference, torch_impl, triton_impl)
PPMA_LINEAR_ATTENTION = Op('ppma_linear_attention', check_linear, reference, torch_impl, triton_impl)


def ppma_decomposed_attention(s1: torch.Tensor, s2: torch.Tensor, v: torch.Tensor, la: torch.Tensor,
                              lb: torch.Tensor, *, form: str = '2d', impl: str = 'auto',
                              chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """PPMDA: ``((s1 s2^T) * L) v`` for a low-rank attention map s1 s2^T.

    s1, s2: (B, heads, H, W, r) (the map is s1 @ s2^T over raster-ordered tokens); v: (B, heads, H, W, d_v);
    la, lb: (B, heads, H, W). form: ``'2d'`` (L2D = L + L^T, the paper's), ``'v2h'`` (L) or ``'h2v'`` (L^T).
    """
    return run(PPMA_DECOMPOSED_ATTENTION, (form, chunk), impl, s1, s2, v, la, lb)


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
    if feature_map is None:
        feature_map = 'identity'
    if isinstance(feature_map, str):
        check_choice('feature_map', feature_map, tuple(FEATURE_MAPS))
        feature_map = FEATURE_MAPS[feature_map]
    return run(PPMA_LINEAR_ATTENTION, (form, feature_map, normalize, eps, chunk), impl, q, k, v, la, lb,
               *(normalizer or ()))
