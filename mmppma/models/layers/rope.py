"""2D-raster rotary position embedding and RMT's fixed per-head decay (docs/method.md §3, 6).

Computed once per stage and handed to every block of the stage: the tables depend on (H, W) only.
"""
from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from mmppma.ops.export import exporting

from .inplace import records_grad


def rope_angles(head_dims: int) -> torch.Tensor:
    """``theta_t = 10000^(-t / (d/2 - 1))`` for t = 0..d/2-1, each repeated for two adjacent channels: (d,)."""
    if head_dims % 2:
        raise ValueError(f'RoPE needs an even head dimension; got {head_dims}. Choose embed_dims / num_heads even.')
    theta = 1.0 / 10000**torch.linspace(0, 1, head_dims // 2, dtype=torch.float64)
    return theta.repeat_interleave(2).float()


def rmt_log_decay(num_heads: int, heads_range: float, initial_value: float = 2.0) -> torch.Tensor:
    """RMT's fixed per-head log-decay ``log(1 - 2^(-initial_value - r*h/n))``, h = 0..n-1: (n,), all < 0."""
    h = torch.arange(num_heads, dtype=torch.float64)
    return torch.log1p(-torch.pow(2.0, -initial_value - heads_range * h / num_heads)).float()


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """``rot(x)[2m] = -x[2m+1]``, ``rot(x)[2m+1] = x[2m]`` along the last dim."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def pair_rotation(dims: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The (dims, dims) matrix R of :func:`rotate_every_two`: ``rot(x) = x @ R`` (entries 0 and +-1, so the product is
    exact)."""
    rotation = torch.zeros(dims // 2, 2, dims // 2, 2, dtype=dtype, device=device)
    pairs = torch.arange(dims // 2, device=device)
    rotation[pairs, 1, pairs, 0] = -1
    rotation[pairs, 0, pairs, 1] = 1
    return rotation.reshape(dims, dims)


def apply_rope(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, inplace: bool = False,
               rotation: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rotate ``x`` (..., d) by tables ``sin``, ``cos`` broadcasting against it (e.g. (H, W, d) for x
    (..., H, W, d)): ``x*cos + rot(x)*sin``.

    ``inplace`` (inference only: while autograd records the result is a new tensor) writes the result into
    ``x``, a tensor nothing else reads. For contiguous float32 / float64 ``x`` this is one complex product
    per channel pair, ``(x_2m + i x_2m+1) e^(i theta)``: the tables hold each angle for both channels of its
    pair, as :func:`rope_angles` makes them; ``rotation`` gives the ``e^(i theta)`` (possibly scaled,
    :meth:`PositionTables.rotation`) instead. Otherwise, in inference, ``rot(x)*sin`` is the pair-swapped ``x``
    times ``sin`` with its even channels negated (equal bit for bit, three passes over ``x`` instead of five).
    While a model is exported (:func:`mmppma.ops.exporting`), ``rot(x)`` is ``x @`` :func:`pair_rotation` (one ONNX
    MatMul, where the swap would be a strided Slice), out of place.
    """
    if exporting():  # the pair swap as a product with a constant matrix (ONNX MatMul, not a strided Slice)
        return x * cos + (x @ pair_rotation(x.shape[-1], x.dtype, x.device)) * sin
    if records_grad(x) or not x.dtype == sin.dtype == cos.dtype:
        return x * cos + rotate_every_two(x) * sin
    if inplace and x.dtype in (torch.float32, torch.float64) and x.is_contiguous():
        turn = torch.complex(cos[..., 0::2], sin[..., 0::2]) if rotation is None else rotation
        torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(turn)
        return x
    sign = torch.arange(-1, 2, 2, dtype=sin.dtype, device=sin.device)  # (-1, 1), made on the device
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    swapped.mul_((sin.unflatten(-1, (-1, 2)) * sign).flatten(-2))
    return (x.mul_(cos) if inplace else x * cos).add_(swapped)


class PositionTables(NamedTuple):
    """What a stage hands to each block: RoPE tables (H, W, d) and, for RMT, the per-head log-decay (n,); tables
    derived from them (other dtypes, complex rotations) are made on first use and kept in ``derived``."""
    sin: torch.Tensor
    cos: torch.Tensor
    log_decay: Optional[torch.Tensor]
    derived: Optional[dict] = None

    def cast(self, dtype: torch.dtype):
        """(sin, cos) in ``dtype``."""
        if self.sin.dtype == dtype or self.derived is None:
            return self.sin.to(dtype), self.cos.to(dtype)
        key = ('cast', dtype)
        if key not in self.derived:
            self.derived[key] = (self.sin.to(dtype), self.cos.to(dtype))
        return self.derived[key]

    def rotation(self, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
        """``scale * (cos + i sin)`` of each channel pair, (H, W, d / 2) complex of ``dtype`` (float32 / float64):
        :func:`apply_rope`'s in-place rotation, times ``scale``."""
        key = ('rotation', dtype, scale)
        if self.derived is not None and key in self.derived:
            return self.derived[key]
        sin, cos = self.cast(dtype)
        turn = torch.complex(cos[..., 0::2], sin[..., 0::2])
        if scale != 1.0:
            turn = turn * scale
        if self.derived is not None:
            self.derived[key] = turn
        return turn


class RasterRoPE2D(nn.Module):
    """Per-stage position module (``layers.{s}.Relpos`` in the release).

    Buffers: ``angle`` (d,) always; ``decay`` (n,) when ``heads_range`` is given (RMT's fixed decays). Both
    are persistent so that release checkpoints (which hold them) load with no unexpected keys.
    Position of token (i, j) is ``p = i*W + j`` (raster order).

    The tables of a size are computed once (outside torch.compile) and kept, with the tables derived from them
    (:class:`PositionTables`), until ``angle`` changes: per size, device and inference mode (a tensor made in
    inference mode must not meet autograd).
    """

    def __init__(self, head_dims: int, num_heads: int, heads_range: Optional[float] = None) -> None:
        super().__init__()
        self.register_buffer('angle', rope_angles(head_dims))
        if heads_range is not None:
            self.register_buffer('decay', rmt_log_decay(num_heads, heads_range))
        else:
            self.decay = None
        self._tables = {}

    def forward(self, height: int, width: int) -> PositionTables:
        if torch.compiler.is_compiling():
            return PositionTables(*self._phase(height, width), self.decay)
        angle = self.angle
        key = (height, width, angle.device, angle._version, angle.data_ptr(), torch.is_inference_mode_enabled(),
               None if self.decay is None else (self.decay._version, self.decay.data_ptr()))
        tables = self._tables.get(key)
        if tables is None:
            if len(self._tables) >= 64:  # sizes of a detection data set: keep the newest
                self._tables.pop(next(iter(self._tables)))
            with torch.no_grad():
                tables = self._tables[key] = PositionTables(*self._phase(height, width), self.decay, {})
        return tables

    def _phase(self, height: int, width: int):
        index = torch.arange(height * width, device=self.angle.device, dtype=torch.float32)
        phase = (index[:, None] * self.angle.float()[None, :]).view(height, width, -1)
        return phase.sin(), phase.cos()
