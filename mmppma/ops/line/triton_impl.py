"""Line attention, Triton kernels: masked softmax attention along image rows or columns (the two halves of
criss-cross attention).

For every line (a row: length W, or a column: length H) of a (BH, H, W, .) tensor:
``out[t] = sum_s softmax_s(scale * q_t . k_s + seg(C; t, s)) x_s`` with C the line's cumsum table.
Rows and columns are read in place through strides (no permute copies). Forward and backward are
flash-style loops over key blocks; the bias gradient is reduced into per-token partial sums owned by one
program each (no atomics). The grid is one axis of (line, block) programs, line-major: the lines (batch * heads *
rows or columns) pass CUDA's 65535 on the other axes at large batches.
"""
from typing import Tuple

import torch
import triton
import triton.language as tl

from ..triton_support import launch as lp
from ..triton_support import tiles
from ..triton_support.tiles import bwd_operands, load_tile, online_softmax_step, store_tile, token_block

LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)  # the kernels' (a plain global is not a constant to triton)


@triton.jit
def _line_offsets(line, n_lines, H, W, COLUMNS: tl.constexpr):
    """(first token of the line's slice, token base, token stride) of a line, in tokens of a (BH, H, W) grid:
    the slice's first token in int64 (BH * H * W * D can pass 2**31), added to the pointers once; the base and
    the per-token offsets within the slice in int32 (cheaper per element)."""
    bh = line // n_lines
    a = line % n_lines
    first = bh.to(tl.int64) * H * W
    if COLUMNS:
        return first, a, W
    return first, a * W, 1


@triton.jit
def _on_line(first, q_ptr, k_ptr, x_ptr, c2_ptr, D, DX):
    """q, k, x and the table moved to the line whose first token is ``first``."""
    return q_ptr + first * D, k_ptr + first * D, x_ptr + first * DX, c2_ptr + first


@triton.jit
def _line_fwd(q_ptr, k_ptr, x_ptr, c2_ptr, o_ptr, lse_ptr, scale2, H, W, L, n_lines, D, DX,
              COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_X: tl.constexpr, PRECISION: tl.constexpr):
    """One program per (line, query block): the online softmax over the line's key blocks, in log2 units (the
    table ``c2`` and the scale ``scale2`` times log2(e)). The log-decays are <= 0 (the ops' contract), so the
    table is monotone along the line and a segment's sum is minus the absolute difference of its ends: no
    per-score compare. Keys past the line read the table as +inf: a bias of -inf, no per-score mask."""
    blocks = tl.cdiv(L, BLOCK_M)
    first, base, step = _line_offsets(tl.program_id(0) // blocks, n_lines, H, W, COLUMNS)
    q_ptr, k_ptr, x_ptr, c2_ptr = _on_line(first, q_ptr, k_ptr, x_ptr, c2_ptr, D, DX)
    o_ptr += first * DX
    lse_ptr += first
    offs_m, mask_m, tok_m = token_block(tl.program_id(0) % blocks * BLOCK_M, BLOCK_M, L, base, step)
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    q = load_tile(q_ptr, tok_m, mask_m, offs_d, D)
    c_m = tl.load(c2_ptr + tok_m, mask=mask_m, other=0.0)
    m_i, l_i, acc = tiles.online_softmax_start(BLOCK_M, BLOCK_X)
    for start_n in range(0, L, BLOCK_N):
        offs_n, mask_n, tok_n = token_block(start_n, BLOCK_N, L, base, step)
        c_n = tl.load(c2_ptr + tok_n, mask=mask_n, other=float('inf'))
        s = tl.dot(q, tl.trans(load_tile(k_ptr, tok_n, mask_n, offs_d, D)), input_precision=PRECISION)
        m_i, l_i, acc = online_softmax_step(s * scale2 - tl.abs(c_m[:, None] - c_n[None, :]),
                                             load_tile(x_ptr, tok_n, mask_n, offs_x, DX), m_i, l_i, acc, PRECISION)
    store_tile(o_ptr, tok_m, mask_m, offs_x, DX, acc / l_i[:, None])
    tl.store(lse_ptr + tok_m, (m_i + tl.math.log2(l_i)) * _LN2, mask=mask_m)  # the backward's: natural units


@triton.jit
def _line_bwd(q_ptr, k_ptr, x_ptr, c2_ptr, do_ptr, lse2_ptr, delta_ptr, g1_ptr, g2_ptr, gc_ptr, scale, scale2,
              H, W, L, n_lines, D, DX, KEYS: tl.constexpr, COLUMNS: tl.constexpr, BLOCK_OWN: tl.constexpr,
              BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_X: tl.constexpr, PRECISION: tl.constexpr):
    """One program per block of BLOCK_OWN keys (KEYS: g1 = dk, g2 = dx, gc = gk) or queries (g1 = dq, gc = gq) of
    one line, looping over the line's other tokens; gc is the own tokens' part of the table gradient,
    sum over the other tokens of sgn(query >= key) dS (the segment-sum convention). Tiles are (own x other
    tokens). The probabilities are recomputed as the forward computes them, in log2 units (``c2``, ``lse2`` and
    ``scale2`` times log2(e); the bias minus an absolute difference; other tokens past the line at -inf through
    the table). Own tokens past the line compute rows that are never stored."""
    blocks = tl.cdiv(L, BLOCK_OWN)
    first, base, step = _line_offsets(tl.program_id(0) // blocks, n_lines, H, W, COLUMNS)
    q_ptr, k_ptr, x_ptr, c2_ptr = _on_line(first, q_ptr, k_ptr, x_ptr, c2_ptr, D, DX)
    g1_ptr += first * D
    do_ptr += first * DX
    g2_ptr += first * DX
    lse2_ptr += first
    delta_ptr += first
    gc_ptr += first
    offs, mask, tok = token_block(tl.program_id(0) % blocks * BLOCK_OWN, BLOCK_OWN, L, base, step)
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    c_own = tl.load(c2_ptr + tok, mask=mask, other=0.0)
    a, da, b_ptr, db_ptr = bwd_operands(q_ptr, k_ptr, x_ptr, do_ptr, tok, mask, offs_d, D, offs_x, DX, KEYS)
    if not KEYS:
        lse = tl.load(lse2_ptr + tok, mask=mask, other=0.0)
        delta = tl.load(delta_ptr + tok, mask=mask, other=0.0)
    g1 = tl.zeros([BLOCK_OWN, BLOCK_D], tl.float32)
    g2 = tl.zeros([BLOCK_OWN, BLOCK_X], tl.float32)
    gc = tl.zeros([BLOCK_OWN], tl.float32)
    for start in range(0, L, BLOCK_OTHER):
        offs_o, mask_o, tok_o = token_block(start, BLOCK_OTHER, L, base, step)
        b = load_tile(b_ptr, tok_o, mask_o, offs_d, D)
        db = load_tile(db_ptr, tok_o, mask_o, offs_x, DX)
        c_o = tl.load(c2_ptr + tok_o, mask=mask_o, other=float('inf'))
        s = tl.dot(a, tl.trans(b), input_precision=PRECISION)
        bias = -tl.abs(c_own[:, None] - c_o[None, :])
        if KEYS:
            ge = offs_o[None, :] >= offs[:, None]  # query >= key
            lse_o = tl.load(lse2_ptr + tok_o, mask=mask_o, other=0.0)
            delta_o = tl.load(delta_ptr + tok_o, mask=mask_o, other=0.0)
            p = tl.math.exp2(s * scale2 - lse_o[None, :] + bias)
            g2 = tl.dot(p.to(db.dtype), db, g2, input_precision=PRECISION)
            ds = p * (tl.dot(da, tl.trans(db), input_precision=PRECISION) - delta_o[None, :])
        else:
            ge = offs[:, None] >= offs_o[None, :]
            p = tl.math.exp2(s * scale2 - lse[:, None] + bias)
            ds = p * (tl.dot(da, tl.trans(db), input_precision=PRECISION) - delta[:, None])
        gc += tl.sum(tl.where(ge, ds, -ds), 1)
        g1 = tl.dot(ds.to(b.dtype), b, g1, input_precision=PRECISION)
    store_tile(g1_ptr, tok, mask, offs_d, D, g1 * scale)
    if KEYS:
        store_tile(g2_ptr, tok, mask, offs_x, DX, g2)
    tl.store(gc_ptr + tok, gc, mask=mask)


def forward_launches(q, k, x, c, scale: float, columns: bool, cap: int):
    """The forward's launch and outputs (out: (BH, H, W, dx), lse: (BH, H, W), float32)."""
    bh, hh, ww, d = q.shape
    dx = x.shape[-1]
    length, n_lines = (hh, ww) if columns else (ww, hh)
    out = torch.empty(bh, hh, ww, dx, device=q.device, dtype=torch.float32)
    lse = torch.empty(bh, hh, ww, device=q.device, dtype=torch.float32)
    cfg = lp.config('line_fwd', length, q.dtype, cap)
    launch = lp.Launch(_line_fwd, (triton.cdiv(length, cfg.block_m) * bh * n_lines, ),
                       (q, k, x, c * LOG2E, out, lse, float(scale) * LOG2E, hh, ww, length, n_lines, d, dx),
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
    args = (float(scale), float(scale) * LOG2E, hh, ww, length, n_lines, d, dx_dim)
    c2, lse2 = c * LOG2E, lse * LOG2E  # log2 units, as the forward
    launches = []
    for keys, own, other, grads in ((True, cfg.block_n, cfg.block_m, (dk, dx, gk)), (False, cfg.block_m, cfg.block_n,
                                                                                    (dq, dq, gq))):
        launches.append(lp.Launch(_line_bwd, (triton.cdiv(length, own) * bh * n_lines, ),
                                  (q, k, x, c2, dout, lse2, delta, *grads, *args),
                                  dict(KEYS=keys, COLUMNS=columns, BLOCK_OWN=own, BLOCK_OTHER=other, BLOCK_D=lp.pow2(d),
                                       BLOCK_X=lp.pow2(dx_dim), PRECISION=lp.precision(q.dtype)), cfg))
    return launches, (dq, dk, dx, gq, gk)


def _forward(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, c: torch.Tensor, scale: float,
             columns: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k: (BH, H, W, d); x: (BH, H, W, dx); c: (BH, H, W) float32 cumsum along the lines -> out (BH, H, W, dx)
    and lse (BH, H, W), float32."""
    launches, out, lse = forward_launches(q, k, x, c, scale, columns, lp.capability(q.device))
    lp.run(launches)
    return out, lse


def _forward_shapes(q, k, x, c, scale, columns):
    return x.new_empty(x.shape, dtype=torch.float32), c.new_empty(c.shape)


def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, c: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, scale: float,
              columns: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dx in the inputs' dtypes and dc (float32) from the output gradient ``dout`` (x's dtype)."""
    launches, (dq, dk, dx, gq, gk) = backward_launches(q, k, x, c, out, lse, dout.contiguous(), scale, columns,
                                                       lp.capability(q.device))
    lp.run(launches)
    return dq.to(q.dtype), dk.to(k.dtype), dx.to(x.dtype), gq - gk


def _backward_shapes(dout, q, k, x, c, out, lse, scale, columns):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(x), torch.empty_like(c)


line_attention_op = lp.library_op('line_attention_triton', _forward, _forward_shapes)
line_attention_backward_op = lp.library_op('line_attention_triton_backward', _backward, _backward_shapes)


def _save(ctx, inputs, output):
    q, k, x, c, scale, columns = inputs
    ctx.save_for_backward(q, k, x, c, *output)
    ctx.mark_non_differentiable(output[1])  # lse: saved for the backward
    ctx.args = (scale, columns)


def _gradients(ctx, dout, dlse):
    """``dout`` arrives in float32 (the op's output, before the cast to x's dtype): the kernels read it in x's
    dtype."""
    q, k, x, c, out, lse = ctx.saved_tensors
    return (*line_attention_backward_op(dout.to(x.dtype), q, k, x, c, out, lse, *ctx.args), None, None)


line_attention_op.register_autograd(_gradients, setup_context=_save)


def line_attention(q, k, x, c, scale: float, columns: bool):
    """Masked attention along rows (columns=False) or columns of (BH, H, W, .) tensors."""
    out, _ = line_attention_op(q.contiguous(), k.contiguous(), x.contiguous(), c.float().contiguous(), float(scale),
                               columns)
    return out.to(x.dtype)
