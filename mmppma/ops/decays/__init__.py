"""The learned decays' tables in one op: :func:`path_decay_tables`, the decay head of a PPMA layer (``PathEmbed``)
and the cumsums of its log-decays, dispatched to the torch path here or to :mod:`.triton_impl` (one launch each
way)."""
import contextlib
from typing import Tuple

import torch
import torch.nn.functional as F

from ..checks import check_choice
from ..dispatch import resolve_impl
from ..masks import decay_tables
from ..plan import eager, run

__all__ = ['path_decay_tables', 'log_decays']


def log_decays(x: torch.Tensor, weight: torch.Tensor, dt_bias: torch.Tensor, rates: torch.Tensor) -> torch.Tensor:
    """The decay head: tokens x (B, H, W, heads * d), one weight (directions, d) shared by the heads, ``dt_bias`` and
    ``rates`` (= -exp(A_log)) per head -> log-decays ``softplus(x_head . weight + dt_bias) * rates`` (B, H, W, heads,
    directions), float32 whatever x's dtype (autocast turned off where it is on; no autocast region otherwise:
    torch.export's pass over such regions fails on a graph with nested scans, the export forms' loops)."""
    b, h, w, _ = x.shape
    autocast = torch.is_autocast_enabled(x.device.type)
    with torch.autocast(device_type=x.device.type, enabled=False) if autocast else contextlib.nullcontext():
        xh = x.float().view(b, h, w, dt_bias.shape[0], weight.shape[-1])
        dt = F.linear(xh, weight.float())  # (B, H, W, heads, directions)
        return F.softplus(dt + dt_bias.float()[:, None]) * rates[:, None]


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
    return run('path_decay_tables', _plan, (impl, ), x, weight, dt_bias, a_log)


def _check(x: torch.Tensor, weight: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor) -> None:
    if x.dim() != 4 or weight.dim() != 2 or dt_bias.dim() != 1 or a_log.shape != dt_bias.shape:
        raise ValueError(f'path_decay_tables takes x (B, H, W, heads * d), weight (directions, d), dt_bias and a_log '
                         f'(heads,); got {tuple(x.shape)}, {tuple(weight.shape)}, {tuple(dt_bias.shape)}, '
                         f'{tuple(a_log.shape)}')
    check_choice('the weight\'s directions', weight.shape[0], (1, 2))
    if x.shape[-1] != dt_bias.shape[0] * weight.shape[1]:
        raise ValueError(f'path_decay_tables: x has {x.shape[-1]} channels, not heads * d = {dt_bias.shape[0]} * '
                         f'{weight.shape[1]}')
    if not x.is_floating_point():
        raise TypeError(f'path_decay_tables takes floating-point tokens, got {x.dtype}')


def _torch(x, weight, dt_bias, a_log):
    log_decay = log_decays(x, weight, dt_bias, -torch.exp(a_log.float()))
    return decay_tables(log_decay[..., 0].permute(0, 3, 1, 2), log_decay[..., -1].permute(0, 3, 1, 2))


def _plan(x, weight, dt_bias, a_log, impl: str, traced=None):
    """The call that runs :func:`path_decay_tables` on inputs like these (checked here): the torch path while
    torch.compile traces or a model is exported (inductor fuses it)."""
    _check(x, weight, dt_bias, a_log)
    if resolve_impl(impl, 'path_decay_tables', (x, )) != 'triton' or not eager():
        return _torch
    from ..triton_support.preflight import triton_plan
    from .triton_impl import decay_tables_triton
    return triton_plan('path_decay_tables', decay_tables_triton, (x, weight, dt_bias, a_log), impl, _torch)
