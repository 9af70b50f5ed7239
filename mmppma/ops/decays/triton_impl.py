"""The decay head and its tables, Triton kernels: one program per (image, head) walks the image's rows, computes
the row's log-decays from its tokens and keeps the column cumsum running; the backward walks the rows in
reverse with the suffix sums of the table gradients, writes the tokens' gradient and each program's sums for the
parameters, which the host adds over the images."""
import functools

import torch
import triton
import triton.language as tl

from ..caches import register_cache
from ..triton_support import launch as lp
from ..triton_support.calls import Caller, raise_named
from .torch_impl import decay_tables_torch

#: tokens x channels of one row's tile at most (larger rows take the torch path: :func:`_config`)
MAX_TILE = 1 << 15


@triton.jit
def _softplus(z):
    """log(1 + e^z) as torch's softplus (z above 20: z), without overflow or the rounding of 1 + e^z."""
    u = tl.exp(-tl.abs(z))
    return tl.where(z > 20.0, z, tl.maximum(z, 0.0) + tl.where(u < 1e-4, u * (1.0 - 0.5 * u), tl.log(1.0 + u)))


@triton.jit
def _tables_fwd(x_ptr, w_ptr, bias_ptr, alog_ptr, ca_ptr, cb_ptr, heads, H, W, D, x_b, x_h, x_w,
                TWO: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)  # image * heads + head
    acc = tl.float32
    offs_d = tl.arange(0, BLOCK_D)
    cols = tl.arange(0, BLOCK_W)
    col_mask = cols < W
    w0 = tl.load(w_ptr + offs_d, mask=offs_d < D, other=0.0).to(acc)
    w1 = tl.load(w_ptr + D + offs_d, mask=offs_d < D, other=0.0).to(acc) if TWO else w0
    bias = tl.load(bias_ptr + pid % heads).to(acc)
    rate = -tl.exp(tl.load(alog_ptr + pid % heads).to(acc))
    x_ptr += (pid // heads).to(tl.int64) * x_b + (pid % heads) * D
    out = pid.to(tl.int64) * H * W
    tokens = cols[:, None] * x_w + offs_d[None, :]
    tile_mask = col_mask[:, None] & (offs_d[None, :] < D)
    column = tl.zeros([BLOCK_W], acc)
    for r in range(0, H):
        x = tl.load(x_ptr + r * x_h + tokens, mask=tile_mask, other=0.0).to(acc)
        la = _softplus(tl.sum(x * w0[None, :], 1) + bias) * rate
        lb = _softplus(tl.sum(x * w1[None, :], 1) + bias) * rate if TWO else la
        column += lb
        tl.store(ca_ptr + out + r * W + cols, tl.cumsum(tl.where(col_mask, la, 0.0), 0), mask=col_mask)
        tl.store(cb_ptr + out + r * W + cols, column, mask=col_mask)


@triton.jit
def _tables_bwd(x_ptr, w_ptr, bias_ptr, alog_ptr, gca_ptr, gcb_ptr, dx_ptr, part_ptr, heads, H, W, D, x_b, x_h, x_w,
                g_b, g_n, g_h, g_w, P, TWO: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_HEADS: tl.constexpr):
    """Gradients from dCa, dCb (strided): dx in x's layout, and the program's row of ``part`` (B * heads, P):
    [d dt_bias (heads), d A_log (heads), d weight (directions * d)], zero in the other heads' places, so that one
    sum over the rows is the parameters' gradients."""
    pid = tl.program_id(0)
    acc = tl.float32
    image, head = pid // heads, pid % heads
    offs_d = tl.arange(0, BLOCK_D)
    cols = tl.arange(0, BLOCK_W)
    col_mask = cols < W
    w0 = tl.load(w_ptr + offs_d, mask=offs_d < D, other=0.0).to(acc)
    w1 = tl.load(w_ptr + D + offs_d, mask=offs_d < D, other=0.0).to(acc) if TWO else w0
    bias = tl.load(bias_ptr + head).to(acc)
    rate = -tl.exp(tl.load(alog_ptr + head).to(acc))
    base = image.to(tl.int64) * x_b + head * D
    x_ptr += base
    dx_ptr += base
    g = image.to(tl.int64) * g_b + head.to(tl.int64) * g_n + cols * g_w
    tokens = cols[:, None] * x_w + offs_d[None, :]
    tile_mask = col_mask[:, None] & (offs_d[None, :] < D)
    column = tl.zeros([BLOCK_W], acc)  # suffix sum of dCb down the column: dlb
    d_bias = tl.zeros([BLOCK_W], acc)
    d_rate = tl.zeros([BLOCK_W], acc)
    d_w0 = tl.zeros([BLOCK_D], acc)
    d_w1 = tl.zeros([BLOCK_D], acc)
    for i in range(0, H):
        r = H - 1 - i
        gca = tl.load(gca_ptr + g + r * g_h, mask=col_mask, other=0.0).to(acc)
        column += tl.load(gcb_ptr + g + r * g_h, mask=col_mask, other=0.0).to(acc)
        dla = tl.cumsum(gca, 0, reverse=True)  # suffix sum along the row
        x = tl.load(x_ptr + r * x_h + tokens, mask=tile_mask, other=0.0).to(acc)
        z0 = tl.sum(x * w0[None, :], 1) + bias
        if TWO:
            z1 = tl.sum(x * w1[None, :], 1) + bias
            d_rate += dla * _softplus(z0) + column * _softplus(z1)
            dz0 = dla * rate * tl.sigmoid(z0)
            dz1 = column * rate * tl.sigmoid(z1)
            d_bias += dz0 + dz1
            d_w0 += tl.sum(dz0[:, None] * x, 0)
            d_w1 += tl.sum(dz1[:, None] * x, 0)
            dx = dz0[:, None] * w0[None, :] + dz1[:, None] * w1[None, :]
        else:
            dl = dla + column
            d_rate += dl * _softplus(z0)
            dz0 = dl * rate * tl.sigmoid(z0)
            d_bias += dz0
            d_w0 += tl.sum(dz0[:, None] * x, 0)
            dx = dz0[:, None] * w0[None, :]
        tl.store(dx_ptr + r * x_h + tokens, dx.to(dx_ptr.dtype.element_ty), mask=tile_mask)
    part = part_ptr + pid.to(tl.int64) * P
    slots = tl.arange(0, BLOCK_HEADS)
    own = slots == head
    tl.store(part + slots, tl.where(own, tl.sum(d_bias, 0), 0.0), mask=slots < heads)
    tl.store(part + heads + slots, tl.where(own, tl.sum(d_rate, 0) * rate, 0.0), mask=slots < heads)
    tl.store(part + 2 * heads + offs_d, d_w0, mask=offs_d < D)
    if TWO:
        tl.store(part + 2 * heads + D + offs_d, d_w1, mask=offs_d < D)


def _plan(x: torch.Tensor, weight: torch.Tensor):
    """(constexprs, config) of the launches for tokens like x, cached per shape; rows longer than one tile raise
    what the preflight takes as a kernel that cannot run (the torch path)."""
    key = (x.shape, weight.shape)
    plan = _PLANS.get(key)
    if plan is None:
        block_w, block_d = lp.pow2(x.shape[2], 1), lp.pow2(weight.shape[1], 1)
        if block_w * block_d > MAX_TILE:
            raise lp.LaunchLimitError(f'path_decay_tables: rows of {x.shape[2]} tokens x {weight.shape[1]} channels '
                                      f'exceed one tile ({MAX_TILE} elements)')
        warps = 1 if block_w * block_d <= 1024 else 4 if block_w * block_d <= 8192 else 8
        plan = _PLANS[key] = (dict(TWO=weight.shape[0] == 2, BLOCK_W=block_w, BLOCK_D=block_d),
                              lp.Config(block_w, block_d, warps, 1))
    return plan


_PLANS = register_cache('decay_tables_launches', 256)


def forward_launches(x, weight, dt_bias, a_log):
    """The forward's launch and its outputs: Ca, Cb (B, heads, H, W) float32. x: (B, H, W, heads * d), channels
    contiguous."""
    b, hh, ww, _ = x.shape
    heads = dt_bias.shape[0]
    constexprs, cfg = _PLANS.get((x.shape, weight.shape)) or _plan(x, weight)
    ca = torch.empty(b, heads, hh, ww, device=x.device, dtype=torch.float32)
    cb = torch.empty(b, heads, hh, ww, device=x.device, dtype=torch.float32)
    xs = x.stride()
    return [lp.Launch(_tables_fwd, (b * heads, ), (x, weight, dt_bias, a_log, ca, cb, heads, hh, ww, weight.shape[1],
                                                   xs[0], xs[1], xs[2]), constexprs, cfg, x.device)], ca, cb


def backward_launches(gca, gcb, x, weight, dt_bias, a_log):
    """The backward's launch and its outputs: dx (x's shape, strides and dtype) and the programs' sums for the
    parameters (B * heads, 2 * heads + weight's size), whose sum over the rows is their gradients."""
    b, hh, ww, _ = x.shape
    heads = dt_bias.shape[0]
    constexprs, cfg = _plan(x, weight)
    gca, gcb = gca.contiguous(), gcb.contiguous()
    p = 2 * heads + weight.numel()
    part = torch.empty(b * heads, p, device=x.device, dtype=torch.float32)
    dx = torch.empty_like(x)
    xs, gs = x.stride(), gca.stride()
    return [lp.Launch(_tables_bwd, (b * heads, ), (x, weight, dt_bias, a_log, gca, gcb, dx, part, heads, hh, ww,
                                                   weight.shape[1], xs[0], xs[1], xs[2], gs[0], gs[1], gs[2], gs[3], p),
                      dict(constexprs, BLOCK_HEADS=lp.pow2(heads, 1)), cfg, x.device)], dx, part


def _tables(caller, x, weight, dt_bias, a_log):
    """The forward's launch run: (Ca, Cb); a failure named for ``caller``."""
    try:
        launches, ca, cb = forward_launches(x, weight, dt_bias, a_log)
        lp.run(launches)
    except Exception as e:
        raise_named(caller, 'while running', e)
    return ca, cb


class DecayTablesFunction(torch.autograd.Function):
    """The kernels as one autograd node of two outputs (Ca, Cb); a missing table gradient is zeros."""

    @staticmethod
    def forward(ctx, caller, x, weight, dt_bias, a_log):
        ctx.set_materialize_grads(False)
        ca, cb = _tables(caller, x, weight, dt_bias, a_log)
        ctx.save_for_backward(x, weight, dt_bias, a_log)
        ctx.caller = caller
        return ca, cb

    @staticmethod
    def backward(ctx, gca, gcb):
        if gca is None and gcb is None:
            return None, None, None, None, None
        x, weight, dt_bias, a_log = ctx.saved_tensors
        gca = torch.zeros_like(gcb) if gca is None else gca
        gcb = torch.zeros_like(gca) if gcb is None else gcb
        try:
            launches, dx, part = backward_launches(gca, gcb, x, weight, dt_bias, a_log)
            lp.run(launches)
        except Exception as e:
            raise_named(ctx.caller, 'in the backward', e)
        heads = dt_bias.shape[0]
        d_bias, d_a_log, d_weight = part.sum(0).split((heads, heads, weight.numel()))
        return None, dx, d_weight.view(weight.shape).to(weight.dtype), d_bias.to(dt_bias.dtype), d_a_log.to(a_log.dtype)


def decay_tables_triton(x, weight, dt_bias, a_log, caller: Caller):
    """:func:`~mmppma.ops.decays.path_decay_tables` on the kernels: (Ca, Cb); ``caller``: what errors name."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or dt_bias.requires_grad
                                    or a_log.requires_grad):
        return DecayTablesFunction.apply(caller, x, weight, dt_bias, a_log)
    return _tables(caller, x, weight, dt_bias, a_log)


def path_decay_tables_plan(x, weight, dt_bias, a_log, traced):
    """The Triton path of :func:`~mmppma.ops.path_decay_tables` (:class:`~mmppma.ops.plan.Op`); the torch path while
    torch.compile traces or a model is exported (``traced`` not False: inductor fuses it)."""
    if traced is not False:
        return decay_tables_torch
    return functools.partial(decay_tables_triton, caller=Caller.of('path_decay_tables', x))
