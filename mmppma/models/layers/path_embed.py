"""The decay-factor projection (``retention.path_embed`` in the release; docs/method.md §1)."""
import math
from typing import Tuple

import torch
import torch.nn as nn

from mmppma.ops import path_decay_tables
from mmppma.ops.decays import log_decays


class PathEmbed(nn.Module):
    """Input-dependent log-decays from the block's normalized tokens.

    ``dt = x_head @ dt_linear.weight^T`` with one (directions, d) weight shared by all heads, no bias;
    ``A = -exp(A_log)`` and ``dt_bias`` per head. ``log_decay = softplus(dt + dt_bias) * A <= 0``.

    Args:
        num_heads: heads n.
        head_dims: channels per head d.
        directions: 2 for separate horizontal/vertical decays (the release), 1 for one decay shared by
            both directions (the paper's Table 4 "shared" ablation).
        dt_min, dt_max, dt_init_floor: range of the initial ``softplus(dt_bias)`` (log-uniform).
        a_init_range: range of the initial ``A = exp(A_log)`` (uniform).
    """

    def __init__(self,
                 num_heads: int,
                 head_dims: int,
                 directions: int = 2,
                 dt_min: float = 1e-3,
                 dt_max: float = 1e-1,
                 dt_init_floor: float = 1e-4,
                 a_init_range: Tuple[float, float] = (1.0, 1.1)) -> None:
        super().__init__()
        if directions not in (1, 2):
            raise ValueError(f'directions must be 1 (shared decay) or 2 (horizontal, vertical); got {directions}')
        self.num_heads, self.head_dims, self.directions = num_heads, head_dims, directions
        self.dt_min, self.dt_max, self.dt_init_floor = dt_min, dt_max, dt_init_floor
        self.a_init_range = a_init_range
        self.dt_linear = nn.Linear(head_dims, directions, bias=False)
        self.A_log = nn.Parameter(torch.empty(num_heads))
        self.dt_bias = nn.Parameter(torch.empty(num_heads))
        # Mamba's convention, read by optimizer constructors that honour it; ours also matches the names.
        self.A_log._no_weight_decay = True
        self.dt_bias._no_weight_decay = True
        self._cached_rates = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``A_log = log U(a_init_range)``; ``dt_bias = softplus^-1(dt0)``, ``dt0`` log-uniform in
        [dt_min, dt_max] and clamped >= dt_init_floor. ``dt_linear`` is left to the Linear init."""
        lo, hi = self.a_init_range
        self.A_log.copy_(torch.empty(self.num_heads).uniform_(lo, hi).log())
        dt = torch.exp(torch.rand(self.num_heads) * (math.log(self.dt_max) - math.log(self.dt_min)) +
                       math.log(self.dt_min)).clamp(min=self.dt_init_floor)
        # inverse of softplus: dt + log(1 - exp(-dt))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """x: (B, H, W, C) -> (la, lb), each (B, heads, H, W) float32, <= 0. ``la is lb`` when shared; otherwise
        both are views of one (B, H, W, heads, 2) tensor (the ops read any strides; their cumsums are contiguous)."""
        log_decay = log_decays(x, self.dt_linear.weight, self.dt_bias, self._rates())
        la = log_decay[..., 0].permute(0, 3, 1, 2)
        return la, la if self.directions == 1 else log_decay[..., 1].permute(0, 3, 1, 2)

    def tables(self, x: torch.Tensor, impl: str = 'auto') -> Tuple[torch.Tensor, torch.Tensor]:
        """x: (B, H, W, C) -> the decay tables (Ca, Cb) of :meth:`forward`'s (la, lb), each (B, heads, H, W) float32:
        :func:`~mmppma.ops.path_decay_tables` (one kernel each way on GPUs)."""
        return path_decay_tables(x, self.dt_linear.weight, self.dt_bias, self.A_log, impl=impl)

    def _rates(self) -> torch.Tensor:
        """``A = -exp(A_log)`` (n,); with grad mode off and outside torch.compile, computed once per value of
        ``A_log`` (a tensor made in inference mode must not meet autograd)."""
        a_log = self.A_log
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return -torch.exp(a_log.float())
        version = (a_log._version, a_log.data_ptr(), a_log.device)
        if self._cached_rates is None or self._cached_rates[0] != version:
            self._cached_rates = (version, -torch.exp(a_log.float()))
        return self._cached_rates[1]

    def extra_repr(self) -> str:
        return f'num_heads={self.num_heads}, head_dims={self.head_dims}, directions={self.directions}'
