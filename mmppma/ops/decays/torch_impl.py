"""The decay head and its tables, torch path: :func:`log_decays` and :func:`~mmppma.ops.masks.decay_tables`
(also while torch.compile traces or a model is exported: inductor fuses them)."""
import contextlib

import torch
import torch.nn.functional as F

from ..masks import decay_tables


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


def decay_tables_torch(x, weight, dt_bias, a_log):
    """:func:`~mmppma.ops.path_decay_tables` on the torch path: (Ca, Cb)."""
    log_decay = log_decays(x, weight, dt_bias, -torch.exp(a_log.float()))
    return decay_tables(log_decay[..., 0].permute(0, 3, 1, 2), log_decay[..., -1].permute(0, 3, 1, 2))


def path_decay_tables_plan(x, weight, dt_bias, a_log):
    """The torch (and reference) path of :func:`~mmppma.ops.path_decay_tables` (:class:`~mmppma.ops.plan.Op`)."""
    return decay_tables_torch
