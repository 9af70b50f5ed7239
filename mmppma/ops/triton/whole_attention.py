"""Fused whole polyline-masked attention (PPMVA, release form) - forward and backward, no N x N tensor.

Scores ``S = scale * q k^T`` are computed once per tile; each path's bias (V2H: M, H2V: M^T) is built in
registers from the O(N) cumsum tables Ca (rows) and Cb (columns), and each path keeps its own online
softmax. The backward recomputes the tiles and reduces the bias gradient inside its loops straight onto the
O(N) cumsum tables: every score's bias reads four table entries, two at the query's or key's own token (row
sums of the score gradient, owned by that token's program) and two at a "corner" token (the query's row and
the key's column for V2H, the reverse for H2V), reduced by one-hot ``tl.dot`` per image row of the owning
block and stored in one slot per (row, block). The host sums the slots: no atomics, deterministic, and
extra memory O(N) (a few floats per token).

Token p = i*W + j. V2H: M[p, s] = Sa(i_p; j_p, l_s) + Sb(l_s; i_p, k_s); H2V: M[s, p].
Segment sum from index u to t along a line with cumsum C: C[max] - C[min] (index order).
"""
import torch
import triton
import triton.language as tl

from ..dispatch import triton_interpreted
from ._tiles import load_tile, store_tile


@triton.jit
def _seg(c_hi_when_ge, c_other, ge):
    """Segment sum in index order: if ge (first index >= second) C[first] - C[second], else reversed."""
    return tl.where(ge, c_hi_when_ge - c_other, c_other - c_hi_when_ge)


@triton.jit
def _bias(ca_ptr, cb_ptr, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid, W, H2V: tl.constexpr):
    """Log-mask tile (BLOCK_M, BLOCK_N) for queries (i_q, j_q) and keys (k_r, l_c)."""
    if H2V:
        # M[s, p]: along the key's row k from column l to j, then along column j from row k to i
        ca_kj = tl.load(ca_ptr + k_r[None, :] * W + j_q[:, None], mask=valid, other=0.0)
        cb_kj = tl.load(cb_ptr + k_r[None, :] * W + j_q[:, None], mask=valid, other=0.0)
        bias = _seg(ca_k[None, :], ca_kj, l_c[None, :] >= j_q[:, None])
        bias += _seg(cb_kj, cb_q[:, None], k_r[None, :] >= i_q[:, None])
    else:
        # M[p, s]: along the query's row i from column j to l, then along column l from row i to k
        ca_il = tl.load(ca_ptr + i_q[:, None] * W + l_c[None, :], mask=valid, other=0.0)
        cb_il = tl.load(cb_ptr + i_q[:, None] * W + l_c[None, :], mask=valid, other=0.0)
        bias = _seg(ca_q[:, None], ca_il, j_q[:, None] >= l_c[None, :])
        bias += _seg(cb_il, cb_k[None, :], i_q[:, None] >= k_r[None, :])
    return bias


@triton.jit
def _load_block(a_ptr, b_ptr, ca_ptr, cb_ptr, offs, mask, offs_d, offs_dv, W, D, DV):
    """One (BH slice) block of tokens ``offs``: its (BLOCK, d) tile of a (q or k), (BLOCK, dv) tile of b (do or
    v), cumsum-table entries, image row and column."""
    a = load_tile(a_ptr, offs, mask, offs_d, D)
    b = load_tile(b_ptr, offs, mask, offs_dv, DV)
    ca = tl.load(ca_ptr + offs, mask=mask, other=0.0)
    cb = tl.load(cb_ptr + offs, mask=mask, other=0.0)
    return a, b, ca, cb, offs // W, offs % W


@triton.jit
def _whole_fwd(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, o_ptr, lse_ptr, scale, N, W, D, DV,
               V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_m = offs_m < N
    i_q = offs_m // W
    j_q = offs_m % W
    q = load_tile(q_ptr + bh * N * D, offs_m, mask_m, offs_d, D)
    ca_q = tl.load(ca_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
    cb_q = tl.load(cb_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
    m1 = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    m2 = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l2 = tl.zeros([BLOCK_M], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start_n in range(0, N, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        valid = mask_m[:, None] & mask_n[None, :]
        k, v, ca_k, cb_k, k_r, l_c = _load_block(k_ptr + bh * N * D, v_ptr + bh * N * DV, ca_ptr + bh * N,
                                                 cb_ptr + bh * N, offs_n, mask_n, offs_d, offs_dv, W, D, DV)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if V2H:
            x = s + _bias(ca_ptr + bh * N, cb_ptr + bh * N, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid,
                          W, False)
            x = tl.where(mask_n[None, :], x, float('-inf'))
            m_new = tl.maximum(m1, tl.max(x, 1))
            alpha = tl.exp(m1 - m_new)
            p = tl.exp(x - m_new[:, None])
            l1 = l1 * alpha + tl.sum(p, 1)
            acc1 = acc1 * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m1 = m_new
        if H2V:
            x = s + _bias(ca_ptr + bh * N, cb_ptr + bh * N, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid,
                          W, True)
            x = tl.where(mask_n[None, :], x, float('-inf'))
            m_new = tl.maximum(m2, tl.max(x, 1))
            alpha = tl.exp(m2 - m_new)
            p = tl.exp(x - m_new[:, None])
            l2 = l2 * alpha + tl.sum(p, 1)
            acc2 = acc2 * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m2 = m_new
    o_mask = mask_m[:, None] & (offs_dv[None, :] < DV)
    path = 0
    if V2H:
        tl.store(o_ptr + bh * N * DV + offs_m[:, None] * DV + offs_dv[None, :], acc1 / l1[:, None], mask=o_mask)
        tl.store(lse_ptr + bh * N + offs_m, m1 + tl.log(l1), mask=mask_m)
        path = 1
    if H2V:
        base = path * tl.num_programs(1) * N
        tl.store(o_ptr + (base + bh * N) * DV + offs_m[:, None] * DV + offs_dv[None, :], acc2 / l2[:, None],
                 mask=o_mask)
        tl.store(lse_ptr + base + bh * N + offs_m, m2 + tl.log(l2), mask=mask_m)


@triton.jit
def _probs(s, ca_ptr, cb_ptr, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid, lse, W, H2V: tl.constexpr):
    x = s + _bias(ca_ptr, cb_ptr, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid, W, H2V)
    return tl.where(valid, tl.exp(x - lse[:, None]), 0.0)


@triton.jit
def _sign(ge):
    return tl.where(ge, 1.0, -1.0)


@triton.jit
def _store_owned_table_grads(acc_a, acc_b, own_row, own_col, mask, pid, offs_w, self_ptr, corner_a_ptr,
                             corner_b_ptr, N, W, BLOCK: tl.constexpr, ROWS: tl.constexpr, SLOTS: tl.constexpr):
    """Epilogue of a block's decay-table gradients. ``acc_a[t, c]``: the block token t's score gradients summed
    over the other tokens in image column c; the Ca segment between t's column and c reads Ca at t itself
    with sign sgn = +1 if own_col >= c else -1 and at the corner (own_row, c) with -sgn. ``acc_b[t, c]``: the
    Cb corner sums at (own_row, c), already signed. Self entries go to ``self_ptr``; corners are summed over
    the block's tokens of each image row and stored, row ``first + r``, into slot ``pid - first_block(row)`` of
    a (H, SLOTS, W) buffer: each (row, slot) has exactly one owner program, so the host's sum over slots is
    deterministic."""
    sgn = _sign(own_col[:, None] >= offs_w[None, :])  # (BLOCK, BLOCK_W)
    tl.store(self_ptr + pid * BLOCK + tl.arange(0, BLOCK), tl.sum(sgn * acc_a, 1), mask=mask)
    first = (pid * BLOCK) // W
    rows = first + tl.arange(0, ROWS)
    onehot_rows = ((own_row[None, :] == rows[:, None]) & mask[None, :]).to(tl.float32)  # (ROWS, BLOCK)
    slot = pid - (rows * W) // BLOCK
    offsets = (rows[:, None] * SLOTS + slot[:, None]) * W + offs_w[None, :]
    store = (rows * W < tl.minimum((pid + 1) * BLOCK, N))[:, None] & (offs_w[None, :] < W)
    tl.store(corner_a_ptr + offsets, tl.dot(onehot_rows, -sgn * acc_a, input_precision='ieee'), mask=store)
    tl.store(corner_b_ptr + offsets, tl.dot(onehot_rows, acc_b, input_precision='ieee'), mask=store)


@triton.jit
def _score_grads(q, k, v, do, ca_ptr, cb_ptr, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid,
                 lse1, delta1, lse2, delta2, scale, w1, w2, W,
                 V2H: tl.constexpr, H2V: tl.constexpr, PRECISION: tl.constexpr):
    """Recompute one (BLOCK_M, BLOCK_N) tile of each path's probabilities P and score gradients
    dS = P * (w dP - delta); a disabled path gives zeros."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    p1 = tl.zeros_like(s)
    ds1 = tl.zeros_like(s)
    p2 = tl.zeros_like(s)
    ds2 = tl.zeros_like(s)
    if V2H:
        p1 = _probs(s, ca_ptr, cb_ptr, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid, lse1, W, False)
        ds1 = p1 * (w1 * dp - delta1[:, None])
    if H2V:
        p2 = _probs(s, ca_ptr, cb_ptr, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid, lse2, W, True)
        ds2 = p2 * (w2 * dp - delta2[:, None])
    return p1, ds1, p2, ds2


@triton.jit
def _path_stats(lse_ptr, delta_ptr, offs, mask, N, V2H: tl.constexpr):
    """Log-sum-exp and delta of both paths for tokens ``offs`` (path 2 is stored first when V2H is off)."""
    base2 = tl.num_programs(1) * N if V2H else 0
    lse1 = tl.load(lse_ptr + offs, mask=mask, other=0.0)
    delta1 = tl.load(delta_ptr + offs, mask=mask, other=0.0)
    lse2 = tl.load(lse_ptr + base2 + offs, mask=mask, other=0.0)
    delta2 = tl.load(delta_ptr + base2 + offs, mask=mask, other=0.0)
    return lse1, delta1, lse2, delta2


@triton.jit
def _whole_bwd_kv(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                  self_a_ptr, self_b_ptr, corner_a_ptr, corner_b_ptr, scale, w1, w2, N, H, W, D, DV,
                  V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_W: tl.constexpr, ROWS: tl.constexpr,
                  SLOTS: tl.constexpr, PRECISION: tl.constexpr):
    """One program per key block: dk, dv, and the decay-table gradients the keys own:
    V2H, Cb[k_s, l_s] (the key's own entry); H2V, Ca[k_s, l_s] and the corners Ca[k_s, j_p], Cb[k_s, j_p]
    (key row, query column), reduced over the block's keys of each image row."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    q_ptr += bh * N * D
    k_ptr += bh * N * D
    v_ptr += bh * N * DV
    do_ptr += bh * N * DV
    ca_ptr += bh * N
    cb_ptr += bh * N
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_w = tl.arange(0, BLOCK_W)
    mask_n = offs_n < N
    k, v, ca_k, cb_k, k_r, l_c = _load_block(k_ptr, v_ptr, ca_ptr, cb_ptr, offs_n, mask_n, offs_d, offs_dv, W, D,
                                             DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    self_b = tl.zeros([BLOCK_N], tl.float32)
    acc_a = tl.zeros([BLOCK_N, BLOCK_W], tl.float32)  # sum over queries of column j of ds2
    acc_b = tl.zeros([BLOCK_N, BLOCK_W], tl.float32)  # the same, signed by sgn(k_s >= i_p)
    for start_m in range(0, N, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        mask_m = offs_m < N
        q, do, ca_q, cb_q, i_q, j_q = _load_block(q_ptr, do_ptr, ca_ptr, cb_ptr, offs_m, mask_m, offs_d, offs_dv,
                                                  W, D, DV)
        lse1, delta1, lse2, delta2 = _path_stats(lse_ptr + bh * N, delta_ptr + bh * N, offs_m, mask_m, N, V2H)
        p1, ds1, p2, ds2 = _score_grads(q, k, v, do, ca_ptr, cb_ptr, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k,
                                        mask_m[:, None] & mask_n[None, :], lse1, delta1, lse2, delta2, scale,
                                        w1, w2, W, V2H, H2V, PRECISION)
        dv += tl.dot(tl.trans((w1 * p1 + w2 * p2).to(do.dtype)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans((ds1 + ds2).to(q.dtype)), q, input_precision=PRECISION)
        if V2H:
            self_b -= tl.sum(ds1 * _sign(i_q[:, None] >= k_r[None, :]), 0)
        if H2V:
            onehot_j = (j_q[:, None] == offs_w[None, :]).to(tl.float32)  # (BLOCK_M, BLOCK_W)
            acc_a += tl.dot(tl.trans(ds2), onehot_j, input_precision='ieee')
            acc_b += tl.dot(tl.trans(ds2 * _sign(k_r[None, :] >= i_q[:, None])), onehot_j, input_precision='ieee')
    store_tile(dk_ptr + bh * N * D, offs_n, mask_n, offs_d, D, dk * scale)
    store_tile(dv_ptr + bh * N * DV, offs_n, mask_n, offs_dv, DV, dv)
    if V2H:
        tl.store(self_b_ptr + bh * N + offs_n, self_b, mask=mask_n)
    if H2V:  # Ca[k, l] - Ca[k, j] if l >= j else the reverse; Cb corner (k_s, j_p)
        _store_owned_table_grads(acc_a, acc_b, k_r, l_c, mask_n, pid_n, offs_w, self_a_ptr + bh * N,
                                 corner_a_ptr + bh * H * SLOTS * W, corner_b_ptr + bh * H * SLOTS * W, N, W,
                                 BLOCK_N, ROWS, SLOTS)


@triton.jit
def _whole_bwd_q(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                 self_a_ptr, self_b_ptr, corner_a_ptr, corner_b_ptr, scale, w1, w2, N, H, W, D, DV,
                 V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_W: tl.constexpr, ROWS: tl.constexpr,
                 SLOTS: tl.constexpr, PRECISION: tl.constexpr):
    """One program per query block: dq, and the decay-table gradients the queries own:
    H2V, Cb[i_p, j_p] (the query's own entry); V2H, Ca[i_p, j_p] and the corners Ca[i_p, l_s], Cb[i_p, l_s]
    (query row, key column), reduced over the block's queries of each image row."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    q_ptr += bh * N * D
    k_ptr += bh * N * D
    v_ptr += bh * N * DV
    do_ptr += bh * N * DV
    ca_ptr += bh * N
    cb_ptr += bh * N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_w = tl.arange(0, BLOCK_W)
    mask_m = offs_m < N
    q, do, ca_q, cb_q, i_q, j_q = _load_block(q_ptr, do_ptr, ca_ptr, cb_ptr, offs_m, mask_m, offs_d, offs_dv, W, D,
                                              DV)
    lse1, delta1, lse2, delta2 = _path_stats(lse_ptr + bh * N, delta_ptr + bh * N, offs_m, mask_m, N, V2H)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    self_b = tl.zeros([BLOCK_M], tl.float32)
    acc_a = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)  # sum over keys of column l of ds1
    acc_b = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)  # the same, signed by sgn(i_p >= k_s)
    for start_n in range(0, N, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        k, v, ca_k, cb_k, k_r, l_c = _load_block(k_ptr, v_ptr, ca_ptr, cb_ptr, offs_n, mask_n, offs_d, offs_dv,
                                                 W, D, DV)
        p1, ds1, p2, ds2 = _score_grads(q, k, v, do, ca_ptr, cb_ptr, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k,
                                        mask_m[:, None] & mask_n[None, :], lse1, delta1, lse2, delta2, scale,
                                        w1, w2, W, V2H, H2V, PRECISION)
        dq += tl.dot((ds1 + ds2).to(k.dtype), k, input_precision=PRECISION)
        if V2H:
            onehot_l = (l_c[:, None] == offs_w[None, :]).to(tl.float32)  # (BLOCK_N, BLOCK_W)
            acc_a += tl.dot(ds1, onehot_l, input_precision='ieee')
            acc_b += tl.dot(ds1 * _sign(i_q[:, None] >= k_r[None, :]), onehot_l, input_precision='ieee')
        if H2V:
            self_b -= tl.sum(ds2 * _sign(k_r[None, :] >= i_q[:, None]), 1)
    store_tile(dq_ptr + bh * N * D, offs_m, mask_m, offs_d, D, dq * scale)
    if V2H:  # Ca[i, j] - Ca[i, l] if j >= l else the reverse; Cb corner (i_p, l_s)
        _store_owned_table_grads(acc_a, acc_b, i_q, j_q, mask_m, pid_m, offs_w, self_a_ptr + bh * N,
                                 corner_a_ptr + bh * H * SLOTS * W, corner_b_ptr + bh * H * SLOTS * W, N, W,
                                 BLOCK_M, ROWS, SLOTS)
    if H2V:
        tl.store(self_b_ptr + bh * N + offs_m, self_b, mask=mask_m)


def _pow2(x: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(int(x)))


def _blocks(n: int):
    if triton_interpreted():  # one configuration, small tiles: the interpreter runs programs one by one
        return 16, 16
    return (64, 64) if n > 1024 else (32, 32)


def _precision(dtype: torch.dtype):
    """float32 inputs: exact fp32 products (no TF32), so kernels match the torch path; half inputs: the
    default (tensor cores with fp32 accumulation)."""
    return 'ieee' if dtype == torch.float32 else None


def _row_span(block: int, width: int):
    """(ROWS, SLOTS) for blocks of ``block`` consecutive tokens of rows ``width`` long: the image rows one block
    can touch (a power of two, at least 16 for ``tl.dot``), and the blocks one row can touch."""
    return _pow2((block - 1) // width + 2), (width - 1) // block + 2


class WholeAttentionFunction(torch.autograd.Function):
    """Autograd wrapper of the fused kernels. Inputs are flattened per (batch*head): q, k (BH, N, d),
    v (BH, N, dv), Ca, Cb (BH, H, W) float32 cumsum tables."""

    @staticmethod
    def forward(ctx, q, k, v, ca, cb, scale: float, v2h: bool, h2v: bool):
        bh, n, d = q.shape
        dv_ = v.shape[-1]
        hh, ww = ca.shape[-2:]
        paths = int(v2h) + int(h2v)
        o = torch.empty(paths, bh, n, dv_, device=q.device, dtype=torch.float32)
        lse = torch.empty(paths, bh, n, device=q.device, dtype=torch.float32)
        block_m, block_n = _blocks(n)
        grid = (triton.cdiv(n, block_m), bh)
        _whole_fwd[grid](q, k, v, ca, cb, o, lse, float(scale), n, ww, d, dv_, v2h, h2v, block_m, block_n,
                         _pow2(d), _pow2(dv_), _precision(q.dtype))
        out = o.mean(0)  # equal weights: 1 path -> itself, 2 paths -> the release's average
        ctx.save_for_backward(q, k, v, ca, cb, o, lse)
        ctx.args = (float(scale), v2h, h2v, hh, ww)
        return out.to(v.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, ca, cb, o, lse = ctx.saved_tensors
        scale, v2h, h2v, hh, ww = ctx.args
        bh, n, d = q.shape
        dv_ = v.shape[-1]
        paths = o.shape[0]
        weight = 1.0 / paths
        dout = dout.contiguous()
        # delta_p = rowsum(dP_p * P_p) = weight * (dout . o_p)
        delta = (weight * (dout.float().unsqueeze(0) * o).sum(-1)).contiguous()
        dq = torch.empty_like(q, dtype=torch.float32)
        dk = torch.empty_like(k, dtype=torch.float32)
        dvv = torch.empty_like(v, dtype=torch.float32)
        block_m, block_n = _blocks(n)
        rows_m, slots_m = _row_span(block_m, ww)
        rows_n, slots_n = _row_span(block_n, ww)
        # O(N) table gradients: each token's own entries, and per image row the "corner" entries (query row,
        # key column for V2H; key row, query column for H2V) summed over one block's tokens in that row.
        zeros = dict(device=q.device, dtype=torch.float32)
        self_q, self_k = torch.zeros(2, bh, n, **zeros), torch.zeros(2, bh, n, **zeros)
        corner_q = torch.zeros(2, bh, hh, slots_m, ww, **zeros)
        corner_k = torch.zeros(2, bh, hh, slots_n, ww, **zeros)
        common = (float(scale), weight, weight, n, hh, ww, d, dv_, v2h, h2v)
        _whole_bwd_kv[(triton.cdiv(n, block_n), bh)](
            q, k, v, ca, cb, dout, lse, delta, dk, dvv, self_k[0], self_k[1], corner_k[0], corner_k[1], *common,
            block_m, block_n, _pow2(d), _pow2(dv_), _pow2(ww), rows_n, slots_n, _precision(q.dtype))
        _whole_bwd_q[(triton.cdiv(n, block_m), bh)](
            q, k, v, ca, cb, dout, lse, delta, dq, self_q[0], self_q[1], corner_q[0], corner_q[1], *common,
            block_m, block_n, _pow2(d), _pow2(dv_), _pow2(ww), rows_m, slots_m, _precision(q.dtype))
        tables = (self_q + self_k).reshape(2, bh, hh, ww) + corner_q.sum(3) + corner_k.sum(3)
        dca, dcb = tables.unbind(0)
        return dq.to(q.dtype), dk.to(k.dtype), dvv.to(v.dtype), dca, dcb, None, None, None


def whole_attention_triton(q, k, v, ca, cb, scale: float, v2h: bool = True, h2v: bool = True):
    """q, k: (B, heads, H, W, d); v: (B, heads, H, W, dv); ca, cb: (B, heads, H, W) float32 cumsums."""
    b, heads, hh, ww, d = q.shape
    bh = b * heads
    out = WholeAttentionFunction.apply(
        q.reshape(bh, hh * ww, d).contiguous(), k.reshape(bh, hh * ww, d).contiguous(),
        v.reshape(bh, hh * ww, v.shape[-1]).contiguous(), ca.reshape(bh, hh, ww).float().contiguous(),
        cb.reshape(bh, hh, ww).float().contiguous(), scale, v2h, h2v)
    return out.reshape(b, heads, hh, ww, v.shape[-1])
