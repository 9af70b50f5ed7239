"""The learned decays' tables in one op: :func:`path_decay_tables`, the decay head of a PPMA layer (``PathEmbed``)
and the cumsums of its log-decays, dispatched (:mod:`mmppma.ops.plan`) to :mod:`.torch_impl` or to
:mod:`.triton_impl` (one launch each way)."""
from typing import Tuple

import torch

from ..checks import check_decay_tables
from ..devices import triton_available
from ..plan import Op, run
from . import torch_impl
from .torch_impl import log_decays

if triton_available():  # the Triton paths import triton
    from . import triton_impl
else:  # no implementation resolves to 'triton' (plan.resolve_impl)
    triton_impl = None

__all__ = ['path_decay_tables', 'log_decays']


#: the reference is the torch path: the tables are cumsums, no mask is formed
PATH_DECAY_TABLES = Op('path_decay_tables', check_decay_tables, torch_impl, torch_impl, triton_impl)


def path_decay_tables(x: torch.Tensor, weight: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor, *,
                      impl: str = 'auto') -> Tuple[torch.Tensor, torch.Tensor]:
    """The decay tables (Ca, Cb) of a learned polyline mask, from the layer's normalized tokens.

    x: (B, H, W, heads * d); weight: (directions, d), directions 2 (horizontal, vertical) or 1 (one decay for both);
    dt_bias, a_log: (heads,). With ``l = softplus(x_head . weight + dt_bias) * -exp(a_log)`` (:func:`log_decays`),
    la = l[..., 0] and lb = l[..., -1]; returns ``decay_tables(la, lb)``: la's cumsum along W and lb's along H,
    each (B, heads, H, W) float32 (computed in float32 whatever x's dtype), what ``ppma_attention`` and
    ``criss_cross_attention`` take with ``tables=True``.
    The Triton path computes both in one launch forward and one backward; the torch path is :func:`log_decays` and
    :func:`~mmppma.ops.masks.decay_tables` (also while torch.compile traces or a model is exported).
    """
    return run(PATH_DECAY_TABLES, (), impl, x, weight, dt_bias, a_log)
