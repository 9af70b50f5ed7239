"""Line attention, Triton kernels: masked softmax attention along image rows or columns (the two halves of
criss-cross attention).

For every line (a row: length W, or a column: length H) of a (BH, H, W, .) tensor:
``out[t] = sum_s softmax_s(scale * q_t . k_s + seg(C; t, s)) x_s`` with C the line's cumsum table.
Rows and columns are read in place through strides (no permute copies). Forward and backward are
flash-style loops over key blocks; the bias gradient is reduced into per-token partial sums owned by one
program each (no atomics). The grid is one axis of (line, block) programs, line-major: the lines (batch * heads *
rows or columns) pass CUDA's 65535 on the other axes at large batches.
"""
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..triton_support import launch as lp
from ..triton_support import tiles
from ..triton_support.preflight import call_kernels
from ..triton_support.tiles import head_offset, load_rows, load_tile, online_softmax_step, store_tile, token_block

LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)  # the kernels' (a plain global is not a constant to triton)
LOG2E_ = tl.constexpr(LOG2E)


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
def _strided_line(line, n_lines, heads, s_b, s_n, s_h, s_w, COLUMNS: tl.constexpr):
    """(slice offset in int64, the line's first element, the step between its tokens) of a line of a (B, heads, H,
    W, .) tensor with strides (s_b, s_n, s_h, s_w)."""
    offset = head_offset(line // n_lines, heads, s_b, s_n)
    if COLUMNS:
        return offset, line % n_lines * s_w, s_h
    return offset, line % n_lines * s_h, s_w


@triton.jit
def _on_strided_line(line, n_lines, heads, H, W, q_ptr, k_ptr, x_ptr, c_ptr, q_b, q_n, q_h, q_w, x_b, x_n, x_h, x_w,
                     COLUMNS: tl.constexpr):
    """q, k, x (strided, :func:`_strided_line`) and the contiguous table moved to ``line``'s slice: the pointers, the
    slice's first token of the contiguous tensors, and (first element, step) of the line's tokens in the table, in
    q and k, in x."""
    first, c_base, c_step = _line_offsets(line, n_lines, H, W, COLUMNS)
    q_off, q_base, q_step = _strided_line(line, n_lines, heads, q_b, q_n, q_h, q_w, COLUMNS)
    x_off, x_base, x_step = _strided_line(line, n_lines, heads, x_b, x_n, x_h, x_w, COLUMNS)
    return (q_ptr + q_off, k_ptr + q_off, x_ptr + x_off, c_ptr + first, first, c_base, c_step, q_base, q_step, x_base,
            x_step)


@triton.jit
def _line_fwd(q_ptr, k_ptr, x_ptr, c_ptr, o_ptr, lse_ptr, m_ptr, scale2, heads, H, W, L, n_lines, D, DX, q_b, q_n,
              q_h, q_w, x_b, x_n, x_h, x_w, r_off, m_b, m_n, m_h, m_w, COLUMNS: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_X: tl.constexpr, PRECISION: tl.constexpr,
              MEAN: tl.constexpr):
    """One program per (line, query block): the online softmax over the line's key blocks, in log2 units (the
    scale ``scale2`` times log2(e), the table scaled per loaded vector). The log-decays are <= 0 (the ops'
    contract), so the table is monotone along the line and a segment's sum is minus the absolute difference of
    its ends: no per-score compare. Keys past the line read the table as +inf: a bias of -inf, no per-score mask.
    q, k (B, heads, H, W, d) with strides (q_b, q_n, q_h, q_w, 1), x likewise; the table c, o and lse are
    contiguous (BH, H, W, .). With MEAN the program also stores the mean of the output and a residual r, read at
    x's strides ``r_off`` elements after x, at ``m_ptr`` (strides m_b, m_n, m_h, m_w, 1; its dtype)."""
    blocks = tl.cdiv(L, BLOCK_M)
    line = tl.program_id(0) // blocks
    q_ptr, k_ptr, x_ptr, c_ptr, first, c_base, c_step, q_base, q_step, x_base, x_step = _on_strided_line(
        line, n_lines, heads, H, W, q_ptr, k_ptr, x_ptr, c_ptr, q_b, q_n, q_h, q_w, x_b, x_n, x_h, x_w, COLUMNS)
    o_ptr += first * DX
    lse_ptr += first
    offs_m, mask_m, tok_m = token_block(tl.program_id(0) % blocks * BLOCK_M, BLOCK_M, L, c_base, c_step)
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    q = load_rows(q_ptr, q_base + offs_m * q_step, mask_m, offs_d, D)
    c_m = tl.load(c_ptr + tok_m, mask=mask_m, other=0.0) * LOG2E_
    m_i, l_i, acc = tiles.online_softmax_start(BLOCK_M, BLOCK_X)
    for start_n in range(0, L, BLOCK_N):
        offs_n, mask_n, tok_n = token_block(start_n, BLOCK_N, L, c_base, c_step)
        c_n = tl.load(c_ptr + tok_n, mask=mask_n, other=float('inf')) * LOG2E_
        s = tl.dot(q, tl.trans(load_rows(k_ptr, q_base + offs_n * q_step, mask_n, offs_d, D)),
                   input_precision=PRECISION)
        m_i, l_i, acc = online_softmax_step(s * scale2 - tl.abs(c_m[:, None] - c_n[None, :]),
                                             load_rows(x_ptr, x_base + offs_n * x_step, mask_n, offs_x, DX), m_i,
                                             l_i, acc, PRECISION)
    o = acc / l_i[:, None]
    store_tile(o_ptr, tok_m, mask_m, offs_x, DX, o)
    tl.store(lse_ptr + tok_m, (m_i + tl.math.log2(l_i)) * _LN2, mask=mask_m)  # the backward's: natural units
    if MEAN:
        r = load_rows(x_ptr + r_off, x_base + offs_m * x_step, mask_m, offs_x, DX)
        m_off, m_base, m_step = _strided_line(line, n_lines, heads, m_b, m_n, m_h, m_w, COLUMNS)
        tl.store(m_ptr + m_off + (m_base + offs_m * m_step)[:, None] + offs_x[None, :],
                 ((o + r.to(tl.float32)) * 0.5).to(m_ptr.dtype.element_ty),
                 mask=mask_m[:, None] & (offs_x[None, :] < DX))


@triton.jit
def _line_bwd(q_ptr, k_ptr, x_ptr, c_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, gc_ptr, scale, scale2, heads,
              H, W, L, n_lines, D, DX, q_b, q_n, q_h, q_w, x_b, x_n, x_h, x_w, o_b, o_n, o_h, o_w,
              KEYS: tl.constexpr, COLUMNS: tl.constexpr, BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_X: tl.constexpr, PRECISION: tl.constexpr, ACC_G1: tl.constexpr,
              ACC_GC: tl.constexpr):
    """One program per block of BLOCK_OWN keys (KEYS: g1 = dk, g2 = dx) or queries (g1 = dq) of one line, looping
    over the line's other tokens. gc is the table gradient: the own tokens' part, sum over the other tokens of
    sgn(query >= key) dS (the segment-sum convention), added by the queries' programs and subtracted by the keys'.
    With ACC_G1 / ACC_GC the program adds g1 / gc to what the buffer holds (an earlier launch's), else stores it:
    one writer per token in a launch, so the sums are in launch order. Tiles are (own x other
    tokens). The probabilities are recomputed as the forward computes them, in log2 units (``scale2`` times
    log2(e), the table scaled per loaded vector; the bias minus an absolute difference; other tokens past the line
    at -inf through the table). Own tokens past the line compute rows that are never stored. q, k, x and the output
    gradient are read by strides ((B, heads, H, W, .), strides (x_b, x_n, x_h, x_w, 1)); the table, lse, delta and
    the gradients (float32) are contiguous."""
    blocks = tl.cdiv(L, BLOCK_OWN)
    line = tl.program_id(0) // blocks
    q_ptr, k_ptr, x_ptr, c_ptr, first, c_base, c_step, q_base, q_step, x_base, x_step = _on_strided_line(
        line, n_lines, heads, H, W, q_ptr, k_ptr, x_ptr, c_ptr, q_b, q_n, q_h, q_w, x_b, x_n, x_h, x_w, COLUMNS)
    o_off, o_base, o_step = _strided_line(line, n_lines, heads, o_b, o_n, o_h, o_w, COLUMNS)
    do_ptr += o_off
    g1_ptr += first * D
    g2_ptr += first * DX
    lse_ptr += first
    delta_ptr += first
    gc_ptr += first
    offs, mask, tok = token_block(tl.program_id(0) % blocks * BLOCK_OWN, BLOCK_OWN, L, c_base, c_step)
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    c_own = tl.load(c_ptr + tok, mask=mask, other=0.0) * LOG2E_
    if KEYS:
        a = load_rows(k_ptr, q_base + offs * q_step, mask, offs_d, D)
        da = load_rows(x_ptr, x_base + offs * x_step, mask, offs_x, DX)
        b_ptr, db_ptr, b_base, b_step, db_base, db_step = q_ptr, do_ptr, q_base, q_step, o_base, o_step
    else:
        a = load_rows(q_ptr, q_base + offs * q_step, mask, offs_d, D)
        da = load_rows(do_ptr, o_base + offs * o_step, mask, offs_x, DX)
        b_ptr, db_ptr, b_base, b_step, db_base, db_step = k_ptr, x_ptr, q_base, q_step, x_base, x_step
        lse = tl.load(lse_ptr + tok, mask=mask, other=0.0) * LOG2E_
        delta = tl.load(delta_ptr + tok, mask=mask, other=0.0)
    g1 = tl.zeros([BLOCK_OWN, BLOCK_D], tl.float32)
    g2 = tl.zeros([BLOCK_OWN, BLOCK_X], tl.float32)
    gc = tl.zeros([BLOCK_OWN], tl.float32)
    for start in range(0, L, BLOCK_OTHER):
        offs_o, mask_o, tok_o = token_block(start, BLOCK_OTHER, L, c_base, c_step)
        b = load_rows(b_ptr, b_base + offs_o * b_step, mask_o, offs_d, D)
        db = load_rows(db_ptr, db_base + offs_o * db_step, mask_o, offs_x, DX)
        c_o = tl.load(c_ptr + tok_o, mask=mask_o, other=float('inf')) * LOG2E_
        s = tl.dot(a, tl.trans(b), input_precision=PRECISION)
        bias = -tl.abs(c_own[:, None] - c_o[None, :])
        if KEYS:
            ge = offs_o[None, :] >= offs[:, None]  # query >= key
            lse_o = tl.load(lse_ptr + tok_o, mask=mask_o, other=0.0) * LOG2E_
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
    g1 = g1 * scale
    if ACC_G1:
        g1 += load_tile(g1_ptr, tok, mask, offs_d, D)
    store_tile(g1_ptr, tok, mask, offs_d, D, g1)
    if KEYS:
        store_tile(g2_ptr, tok, mask, offs_x, DX, g2)
        gc = -gc
    if ACC_GC:
        gc += tl.load(gc_ptr + tok, mask=mask, other=0.0)
    tl.store(gc_ptr + tok, gc, mask=mask)


def forward_launches(q, k, x, c, scale: float, columns: bool, cap: int, residual=None):
    """The forward's launch and outputs (out: (B, heads, H, W, dx), lse: (B, heads, H, W), float32). q, k: (B,
    heads, H, W, d), k with q's strides; x (B, heads, H, W, dx); channels contiguous; c (B, heads, H, W) float32,
    contiguous. With a ``residual`` r (x's shape, strides and storage), also (out + r) / 2 in r's dtype, as a (B, H,
    W, heads, dx) tensor's view (B, heads, H, W, dx)."""
    b, heads, hh, ww, d = q.shape
    dx = x.shape[-1]
    key = (q.shape, dx, q.dtype, cap, columns, lp.precision(q.dtype))
    plan = _FWD_PLANS.get(key)
    if plan is None:
        length, n_lines = (hh, ww) if columns else (ww, hh)
        cfg = lp.config('line_fwd', length, q.dtype, cap)
        plan = _FWD_PLANS[key] = ((lp.cdiv(length, cfg.block_m) * b * heads * n_lines, ), cfg,
                                  _constexprs(cfg, columns, d, dx, q.dtype), length, n_lines)
    grid, cfg, constexprs, length, n_lines = plan
    out = torch.empty(b, heads, hh, ww, dx, device=q.device, dtype=torch.float32)
    lse = torch.empty(b, heads, hh, ww, device=q.device, dtype=torch.float32)
    qs, xs = q.stride(), x.stride()
    if residual is None:
        mean, r_off, ms = out, 0, (0, 0, 0, 0)
    else:
        if residual.stride() != x.stride() or residual.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
            raise ValueError('line attention: the residual must be a view of x\'s storage with x\'s strides')
        mean = torch.empty(b, hh, ww, heads, dx, device=q.device, dtype=residual.dtype).permute(0, 3, 1, 2, 4)
        r_off, ms = residual.storage_offset() - x.storage_offset(), mean.stride()
    launch = lp.Launch(_line_fwd, grid, (q, k, x, c, out, lse, mean, scale * LOG2E, heads, hh, ww, length, n_lines, d,
                                         dx, qs[0], qs[1], qs[2], qs[3], xs[0], xs[1], xs[2], xs[3], r_off, *ms[:4]),
                       dict(constexprs, MEAN=residual is not None), cfg, q.device)
    if residual is None:
        return [launch], out, lse
    return [launch], out, lse, mean


_FWD_PLANS = {}


def _constexprs(cfg: lp.Config, columns: bool, d: int, dx: int, dtype: torch.dtype) -> dict:
    return dict(COLUMNS=columns, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=lp.pow2(d), BLOCK_X=lp.pow2(dx),
                PRECISION=lp.precision(dtype))


def backward_launches(q, k, x, c, out, lse, dout, scale: float, columns: bool, cap: int, dq=None, dk=None, dc=None):
    """The backward's launches (the keys' programs, then the queries') and the buffers they fill: dq, dk, dx
    (float32, shaped as q, k, x, contiguous) and dc (float32, as c). q, k, x, c, dout as :func:`forward_launches`
    takes q, k, x, c; out, lse as it returns them. A given ``dq``, ``dk`` or ``dc`` (an earlier pass's, of the same
    q, k or table) is added to, not replaced."""
    b, heads, hh, ww, d = q.shape
    dx_dim = x.shape[-1]
    length, n_lines = (hh, ww) if columns else (ww, hh)
    delta = (dout * out).sum(-1)
    f32 = dict(device=q.device, dtype=torch.float32)
    acc_q, acc_k, acc_c = dq is not None, dk is not None, dc is not None
    dq = dq if acc_q else torch.empty(q.shape, **f32)
    dk = dk if acc_k else torch.empty(k.shape, **f32)
    dc = dc if acc_c else torch.empty(c.shape, **f32)
    dx = torch.empty(x.shape, **f32)
    cfg = lp.config('line_bwd', length, q.dtype, cap)
    qs, xs, os_ = q.stride(), x.stride(), dout.stride()
    args = (scale, scale * LOG2E, heads, hh, ww, length, n_lines, d, dx_dim, qs[0], qs[1], qs[2], qs[3], xs[0],
            xs[1], xs[2], xs[3], os_[0], os_[1], os_[2], os_[3])
    launches = []
    # the keys' programs first: their table part is stored (or added), the queries' added to it
    for keys, own, other, grads, acc in ((True, cfg.block_n, cfg.block_m, (dk, dx, dc), (acc_k, acc_c)),
                                         (False, cfg.block_m, cfg.block_n, (dq, dq, dc), (acc_q, True))):
        launches.append(lp.Launch(_line_bwd, (lp.cdiv(length, own) * b * heads * n_lines, ),
                                  (q, k, x, c, dout, lse, delta, *grads, *args),
                                  dict(KEYS=keys, COLUMNS=columns, BLOCK_OWN=own, BLOCK_OTHER=other, BLOCK_D=lp.pow2(d),
                                       BLOCK_X=lp.pow2(dx_dim), PRECISION=lp.precision(q.dtype), ACC_G1=acc[0],
                                       ACC_GC=acc[1]), cfg, q.device))
    return launches, (dq, dk, dx, dc)


def _forward(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, c: torch.Tensor, scale: float,
             columns: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k, x, c as :func:`forward_launches` takes them -> out (B, heads, H, W, dx) and lse (B, heads, H, W),
    float32."""
    launches, out, lse = forward_launches(q, k, x, c, scale, columns, lp.capability(q.device))
    lp.run(launches)
    return out, lse


def _forward_shapes(q, k, x, c, scale, columns):
    return x.new_empty(x.shape, dtype=torch.float32), c.new_empty(c.shape)


def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, c: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, scale: float,
              columns: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dx in the inputs' dtypes and dc (float32), shaped as the inputs, from the output gradient ``dout``
    (read in x's dtype)."""
    dout = dout.to(x.dtype)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    launches, (dq, dk, dx, dc) = backward_launches(q, k, x, c, out, lse, dout, scale, columns,
                                                   lp.capability(q.device))
    lp.run(launches)
    return dq.to(q.dtype), dk.to(k.dtype), dx.to(x.dtype), dc


def _backward_shapes(dout, q, k, x, c, out, lse, scale, columns):
    return q.new_empty(q.shape), k.new_empty(k.shape), x.new_empty(x.shape), c.new_empty(c.shape)


# the ops as torch.compile sees them (one node each); eager calls take LINE_KERNELS below
line_attention_op = lp.library_op('line_attention_triton', _forward, _forward_shapes)
line_attention_backward_op = lp.library_op('line_attention_triton_backward', _backward, _backward_shapes)


def _save(ctx, inputs, output):
    q, k, x, c, scale, columns = inputs
    ctx.save_for_backward(q, k, x, c, *output)
    ctx.mark_non_differentiable(output[1])  # lse: saved for the backward
    ctx.args = (scale, columns)


def _gradients(ctx, dout, dlse):
    """``dout`` arrives in float32 (the op's output, before the cast to x's dtype): :func:`_backward` reads it in
    x's dtype."""
    return (*line_attention_backward_op(dout, *ctx.saved_tensors, *ctx.args), None, None)


line_attention_op.register_autograd(_gradients, setup_context=_save)


def _forward_saving_out(q, k, x, c, scale: float, columns: bool):
    out, lse = _forward(q, k, x, c, scale, columns)
    return out, out, lse


#: the eager path of :data:`line_attention_op` (:class:`KernelFunction`): out and lse saved, lse not returned
LINE_KERNELS = (_forward_saving_out, _backward, 4)


def line_attention(q, k, x, c, scale: float, columns: bool, op: str = 'criss_cross_attention',
                   traced: Optional[bool] = None):
    """Masked attention along rows (columns=False) or columns of q, k (B, heads, H, W, d), x (B, heads, H, W, dx)
    with the table c (B, heads, H, W) cumulated along them; ``op`` names the public op in errors; ``traced``:
    whether torch.compile traces the call (None: ask)."""
    q, k, x = lp.kernel_layout(q, k, x)
    c = c.float().contiguous()
    out = call_kernels(op, line_attention_op, LINE_KERNELS, _forward, traced, q, k, x, c, float(scale), columns)
    return out.to(x.dtype)
