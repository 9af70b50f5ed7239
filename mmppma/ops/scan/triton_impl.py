"""Decay scan, Triton kernel: the bidirectional 1D scan ``y_t = sum_s exp(seg(C; t, s)) x_s`` (Algorithm 1's
building block).

Tiled as a masked matrix product along each line (tensor cores, O(L^2 D) per line - lines are image
rows/columns, so O(N^1.5) in total). The mask is symmetric, so the input gradient is the same scan of
the output gradient; the decay gradient comes from two *signed* scans (weights +w below the diagonal,
-w above, 0 on it): ``dC = dy . signed(x) + x . signed(dy)``. The mask-vector products
(:func:`~mmppma.ops.polyline_mask_matvec`, :func:`~mmppma.ops.polyline_mask_matvec_3d`) run their scans here.
"""
import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ..triton_support import launch as lp
from ..triton_support.calls import Caller, call_kernels
from .torch_impl import matvec


@triton.jit
def _scan_kernel(x_ptr, c_ptr, y_ptr, L, D, SIGNED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    blocks = tl.cdiv(L, BLOCK_M)
    pid_m = tl.program_id(0) % blocks  # axis 0: (line, block) programs, line-major (the lines pass 65535)
    line = tl.program_id(0) // blocks
    pid_d = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_m = offs_m < L
    mask_d = offs_d < D
    line = line.to(tl.int64)  # lines * L * D can pass 2**31
    c_m = tl.load(c_ptr + line * L + offs_m, mask=mask_m, other=0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, L, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < L
        c_n = tl.load(c_ptr + line * L + offs_n, mask=mask_n, other=0.0)
        x = tl.load(x_ptr + (line * L + offs_n[:, None]) * D + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        ge = offs_m[:, None] >= offs_n[None, :]
        w = tl.exp(tl.where(ge, c_m[:, None] - c_n[None, :], c_n[None, :] - c_m[:, None]))
        if SIGNED:
            w = tl.where(offs_m[:, None] > offs_n[None, :], w, tl.where(ge, 0.0, -w))
        w = tl.where(mask_n[None, :], w, 0.0)
        acc += tl.dot(w.to(x.dtype), x, input_precision=PRECISION)
    tl.store(y_ptr + (line * L + offs_m[:, None]) * D + offs_d[None, :], acc, mask=mask_m[:, None] & mask_d[None, :])


def scan_launches(x: torch.Tensor, c: torch.Tensor, signed: bool, cap: int):
    """x: (lines, L, D), c: (lines, L) float32 -> the launch and its output y, float32 (lines, L, D)."""
    lines, length, d = x.shape
    y = torch.empty(lines, length, d, device=x.device, dtype=torch.float32)
    cfg = lp.config('scan', length, x.dtype, cap)
    block_d = min(lp.pow2(d), 64)
    return [lp.Launch(_scan_kernel, (triton.cdiv(length, cfg.block_m) * lines, triton.cdiv(d, block_d)),
                      (x, c, y, length, d),
                      dict(SIGNED=signed, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d,
                           PRECISION=lp.precision(x.dtype)), cfg)], y


def _scan(x: torch.Tensor, c: torch.Tensor, signed: bool) -> torch.Tensor:
    launches, y = scan_launches(x, c, signed, lp.capability(x.device))
    lp.run(launches)
    return y


scan_op = lp.library_op('decay_scan_triton', _scan, lambda x, c, signed: x.new_empty(x.shape, dtype=torch.float32))


def _save(ctx, inputs, output):
    x, c, signed = inputs
    ctx.save_for_backward(x, c)
    ctx.signed = signed


def _gradients(ctx, dy):
    """``dy`` arrives in float32 (the op's output, before the cast to x's dtype): the kernel reads it in x's dtype."""
    if ctx.signed:
        raise NotImplementedError('mmppma::decay_scan_triton: the signed scan (a gradient) has no gradient')
    x, c = ctx.saved_tensors
    dy = dy.to(x.dtype).contiguous()
    dx = scan_op(dy, c, False).to(x.dtype) if ctx.needs_input_grad[0] else None
    dc = None
    if ctx.needs_input_grad[1]:
        dc = (dy.float() * scan_op(x, c, True)).sum(-1) + (x.float() * scan_op(dy, c, True)).sum(-1)
    return dx, dc, None


scan_op.register_autograd(_gradients, setup_context=_save)


def _forward(x: torch.Tensor, c: torch.Tensor):
    return (_scan(x, c, False), )


def _backward(dy: torch.Tensor, x: torch.Tensor, c: torch.Tensor):
    """dx in x's dtype and dc (float32) from the float32 output gradient ``dy`` (read in x's dtype)."""
    dy = dy.to(x.dtype).contiguous()
    dc = (dy.float() * _scan(x, c, True)).sum(-1) + (x.float() * _scan(dy, c, True)).sum(-1)
    return _scan(dy, c, False).to(x.dtype), dc


def _library(x: torch.Tensor, c: torch.Tensor):
    return (scan_op(x, c, False), )


#: the eager path of :data:`scan_op` (:class:`~mmppma.ops.triton_support.calls.KernelFunction`)
SCAN_KERNELS = (_forward, _backward, 2)


def decay_scan_triton(x: torch.Tensor, log_decay: torch.Tensor, caller: Caller,
                      traced: Optional[bool] = None) -> torch.Tensor:
    """x: (..., L, D); log_decay: (..., L) -> (..., L, D), like :func:`mmppma.ops.decay_scan_1d`; ``caller``: what
    errors name; ``traced``: whether torch.compile traces the call (None: ask)."""
    *lead, length, d = x.shape
    c = log_decay.float().cumsum(-1).reshape(-1, length).contiguous()
    y = call_kernels(caller, _library, SCAN_KERNELS, _forward, traced, x.reshape(-1, length, d).contiguous(), c)
    return y.to(x.dtype).reshape(*lead, length, d)


def decay_scan_1d_plan(x, log_decay, chunk: int, traced: Optional[bool]):
    """The Triton path of :func:`~mmppma.ops.decay_scan_1d` (:class:`~mmppma.ops.plan.Op`)."""
    return functools.partial(decay_scan_triton, caller=Caller.of('decay_scan_1d', x), traced=traced)


def polyline_mask_matvec_plan(x, la, lb, form: str, chunk: int, traced: Optional[bool]):
    """The Triton path of :func:`~mmppma.ops.polyline_mask_matvec`: Algorithm 1 on the scan kernel."""
    scan = functools.partial(decay_scan_triton, caller=Caller.of('polyline_mask_matvec', x), traced=traced)
    return functools.partial(matvec, scan, form=form)
