"""Masked softmax attention along image rows or columns (the two halves of criss-cross attention).

For every line (a row: length W, or a column: length H) of a (BH, H, W, .) tensor:
``out[t] = sum_s softmax_s(scale * q_t . k_s + seg(C; t, s)) x_s`` with C the line's cumsum table.
Rows and columns are read in place through strides (no permute copies). Forward and backward are
flash-style loops over key blocks; the bias gradient is reduced into per-token partial sums owned by one
program each (no atomics).
"""
import torch
import triton
import triton.language as tl

from ..attention import compose_criss_cross
from . import launch as lp
from ._tiles import load_tile, online_softmax_step, seg, sign, store_tile


@triton.jit
def _line_offsets(line, n_lines, H, W, COLUMNS: tl.constexpr):
    """(token base, token stride) of a line, in tokens of a (BH, H, W) grid; the base in int64 (BH * H * W * D
    can pass 2**31)."""
    bh = (line // n_lines).to(tl.int64)
    a = line % n_lines
    if COLUMNS:
        return bh * H * W + a, W
    return (bh * H + a) * W, 1


@triton.jit
def _line_fwd(q_ptr, k_ptr, x_ptr, c_ptr, o_ptr, lse_ptr, scale, H, W, L, n_lines, D, DX,
              COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_X: tl.constexpr, PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    line = tl.program_id(1)
    base, step = _line_offsets(line, n_lines, H, W, COLUMNS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    mask_m = offs_m < L
    tok_m = base + offs_m * step
    q = load_tile(q_ptr, tok_m, mask_m, offs_d, D)
    c_m = tl.load(c_ptr + tok_m, mask=mask_m, other=0.0)
    m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_X], tl.float32)
    for start_n in range(0, L, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < L
        tok_n = base + offs_n * step
        k = load_tile(k_ptr, tok_n, mask_n, offs_d, D)
        x = load_tile(x_ptr, tok_n, mask_n, offs_x, DX)
        c_n = tl.load(c_ptr + tok_n, mask=mask_n, other=0.0)
        bias = seg(c_m[:, None], c_n[None, :], offs_m[:, None] >= offs_n[None, :])
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale + bias
        m_i, l_i, acc = online_softmax_step(tl.where(mask_n[None, :], s, float('-inf')), x, m_i, l_i, acc,
                                            PRECISION)
    tl.store(o_ptr + tok_m[:, None] * DX + offs_x[None, :], acc / l_i[:, None],
             mask=mask_m[:, None] & (offs_x[None, :] < DX))
    tl.store(lse_ptr + tok_m, m_i + tl.log(l_i), mask=mask_m)


@triton.jit
def _line_tile(q, k, c_m, c_n, offs_m, offs_n, lse, valid, scale, PRECISION: tl.constexpr):
    ge = offs_m[:, None] >= offs_n[None, :]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale + seg(c_m[:, None], c_n[None, :], ge)
    p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
    return p, sign(ge)


@triton.jit
def _line_bwd_kv(q_ptr, k_ptr, x_ptr, c_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dx_ptr, gk_ptr, scale,
                 H, W, L, n_lines, D, DX, COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_X: tl.constexpr, PRECISION: tl.constexpr):
    pid_n = tl.program_id(0)
    line = tl.program_id(1)
    base, step = _line_offsets(line, n_lines, H, W, COLUMNS)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    mask_n = offs_n < L
    tok_n = base + offs_n * step
    k = load_tile(k_ptr, tok_n, mask_n, offs_d, D)
    x = load_tile(x_ptr, tok_n, mask_n, offs_x, DX)
    c_n = tl.load(c_ptr + tok_n, mask=mask_n, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dx = tl.zeros([BLOCK_N, BLOCK_X], tl.float32)
    gk = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, L, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        mask_m = offs_m < L
        tok_m = base + offs_m * step
        q = load_tile(q_ptr, tok_m, mask_m, offs_d, D)
        do = load_tile(do_ptr, tok_m, mask_m, offs_x, DX)
        c_m = tl.load(c_ptr + tok_m, mask=mask_m, other=0.0)
        lse = tl.load(lse_ptr + tok_m, mask=mask_m, other=0.0)
        delta = tl.load(delta_ptr + tok_m, mask=mask_m, other=0.0)
        p, sign = _line_tile(q, k, c_m, c_n, offs_m, offs_n, lse, mask_m[:, None] & mask_n[None, :], scale,
                             PRECISION)
        dx += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dp = tl.dot(do, tl.trans(x), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        gk += tl.sum(ds * sign, 0)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    store_tile(dk_ptr, tok_n, mask_n, offs_d, D, dk * scale)
    store_tile(dx_ptr, tok_n, mask_n, offs_x, DX, dx)
    tl.store(gk_ptr + tok_n, gk, mask=mask_n)


@triton.jit
def _line_bwd_q(q_ptr, k_ptr, x_ptr, c_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, gq_ptr, scale,
                H, W, L, n_lines, D, DX, COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_X: tl.constexpr, PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    line = tl.program_id(1)
    base, step = _line_offsets(line, n_lines, H, W, COLUMNS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    mask_m = offs_m < L
    tok_m = base + offs_m * step
    q = load_tile(q_ptr, tok_m, mask_m, offs_d, D)
    do = load_tile(do_ptr, tok_m, mask_m, offs_x, DX)
    c_m = tl.load(c_ptr + tok_m, mask=mask_m, other=0.0)
    lse = tl.load(lse_ptr + tok_m, mask=mask_m, other=0.0)
    delta = tl.load(delta_ptr + tok_m, mask=mask_m, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    gq = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(0, L, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < L
        tok_n = base + offs_n * step
        k = load_tile(k_ptr, tok_n, mask_n, offs_d, D)
        x = load_tile(x_ptr, tok_n, mask_n, offs_x, DX)
        c_n = tl.load(c_ptr + tok_n, mask=mask_n, other=0.0)
        p, sign = _line_tile(q, k, c_m, c_n, offs_m, offs_n, lse, mask_m[:, None] & mask_n[None, :], scale,
                             PRECISION)
        dp = tl.dot(do, tl.trans(x), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        gq += tl.sum(ds * sign, 1)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    store_tile(dq_ptr, tok_m, mask_m, offs_d, D, dq * scale)
    tl.store(gq_ptr + tok_m, gq, mask=mask_m)


def forward_launches(q, k, x, c, scale: float, columns: bool, cap: int):
    """The forward's launch and outputs (out: (BH, H, W, dx), lse: (BH, H, W), float32)."""
    bh, hh, ww, d = q.shape
    dx = x.shape[-1]
    length, n_lines = (hh, ww) if columns else (ww, hh)
    out = torch.empty(bh, hh, ww, dx, device=q.device, dtype=torch.float32)
    lse = torch.empty(bh, hh, ww, device=q.device, dtype=torch.float32)
    cfg = lp.config('line_fwd', length, q.dtype, cap)
    launch = lp.Launch(_line_fwd, (triton.cdiv(length, cfg.block_m), bh * n_lines),
                       (q, k, x, c, out, lse, float(scale), hh, ww, length, n_lines, d, dx),
                       _constexprs(cfg, columns, d, dx, q.dtype), cfg)
    return [launch], out, lse


def _constexprs(cfg: lp.Config, columns: bool, d: int, dx: int, dtype: torch.dtype) -> dict:
    return dict(COLUMNS=columns, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=lp.pow2(d), BLOCK_X=lp.pow2(dx),
                PRECISION=lp.precision(dtype))


def backward_launches(q, k, x, c, out, lse, dout, scale: float, columns: bool, cap: int):
    """The backward's launches and the buffers they fill: dq, dk, dx (float32) and the table-gradient parts
    gq, gk (BH, H, W) (dc = gq - gk)."""
    bh, hh, ww, d = q.shape
    dx_dim = x.shape[-1]
    length, n_lines = (hh, ww) if columns else (ww, hh)
    delta = (dout.float() * out).sum(-1).contiguous()
    dq = torch.empty_like(q, dtype=torch.float32)
    dk = torch.empty_like(k, dtype=torch.float32)
    dx = torch.empty_like(x, dtype=torch.float32)
    gq = torch.empty_like(c)
    gk = torch.empty_like(c)
    cfg = lp.config('line_bwd', length, q.dtype, cap)
    args = (float(scale), hh, ww, length, n_lines, d, dx_dim)
    constexprs = _constexprs(cfg, columns, d, dx_dim, q.dtype)
    return [lp.Launch(_line_bwd_kv, (triton.cdiv(length, cfg.block_n), bh * n_lines),
                      (q, k, x, c, dout, lse, delta, dk, dx, gk, *args), constexprs, cfg),
            lp.Launch(_line_bwd_q, (triton.cdiv(length, cfg.block_m), bh * n_lines),
                      (q, k, x, c, dout, lse, delta, dq, gq, *args), constexprs, cfg)], (dq, dk, dx, gq, gk)


class LineAttentionFunction(torch.autograd.Function):
    """q, k: (BH, H, W, d); x: (BH, H, W, dx); c: (BH, H, W) float32 cumsum along the lines."""

    @staticmethod
    def forward(ctx, q, k, x, c, scale: float, columns: bool):
        launches, out, lse = forward_launches(q, k, x, c, scale, columns, lp.capability(q.device))
        lp.run(launches)
        ctx.save_for_backward(q, k, x, c, out, lse)
        ctx.args = (float(scale), columns)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, x, c, out, lse = ctx.saved_tensors
        scale, columns = ctx.args
        launches, (dq, dk, dx, gq, gk) = backward_launches(q, k, x, c, out, lse, dout.contiguous(), scale, columns,
                                                           lp.capability(q.device))
        lp.run(launches)
        return dq.to(q.dtype), dk.to(k.dtype), dx.to(x.dtype), gq - gk, None, None


def line_attention(q, k, x, c, scale: float, columns: bool):
    """Masked attention along rows (columns=False) or columns of (BH, H, W, .) tensors."""
    return LineAttentionFunction.apply(q.contiguous(), k.contiguous(), x.contiguous(), c.float().contiguous(),
                                       scale, columns)


def criss_cross_attention_triton(q, k, v, ca, cb, scale: float, order: str):
    """q, k: (B, heads, H, W, d); v: (B, heads, H, W, dv); ca (row cumsums), cb (column cumsums):
    (B, heads, H, W). ``order`` as :func:`mmppma.ops.criss_cross_attention`."""
    b, heads, hh, ww, d = q.shape
    dv = v.shape[-1]
    q3, k3 = q.reshape(b * heads, hh, ww, d), k.reshape(b * heads, hh, ww, d)
    v3 = v.reshape(b * heads, hh, ww, dv)
    ca3, cb3 = ca.reshape(b * heads, hh, ww), cb.reshape(b * heads, hh, ww)

    def rows(x):
        return line_attention(q3, k3, x, ca3, scale, False)

    def cols(x):
        return line_attention(q3, k3, x, cb3, scale, True)

    return compose_criss_cross(rows, cols, v3, order).reshape(b, heads, hh, ww, dv)
