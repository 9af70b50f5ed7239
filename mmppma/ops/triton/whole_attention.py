"""Fused whole polyline-masked attention (PPMVA, release form) - forward and backward, no N x N tensor.

Scores ``S = scale * q k^T`` are computed once per tile; each path's bias (V2H: M, H2V: M^T) is built in
registers from the O(N) cumsum tables Ca (rows) and Cb (columns), and each path keeps its own online
softmax. The backward recomputes the tiles; the bias gradient is reduced inside the loops into O(N^1.5)
segment tables (one-hot reductions by ``tl.dot``), each owned by one program: no atomics, deterministic.

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
        k_r = offs_n // W
        l_c = offs_n % W
        k = load_tile(k_ptr + bh * N * D, offs_n, mask_n, offs_d, D)
        v = load_tile(v_ptr + bh * N * DV, offs_n, mask_n, offs_dv, DV)
        ca_k = tl.load(ca_ptr + bh * N + offs_n, mask=mask_n, other=0.0)
        cb_k = tl.load(cb_ptr + bh * N + offs_n, mask=mask_n, other=0.0)
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
def _whole_bwd_kv(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                  ga_ptr, gb_ptr, scale, w1, w2, N, H, W, D, DV,
                  V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
                  PRECISION: tl.constexpr):
    """One program per key block: dk, dv, and the key-owned table gradients
    gb[s, i] = dSb[l_s, i, k_s] (V2H) and ga[s, j] = dSa[k_s, l_s, j] (H2V)."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    nbh = tl.num_programs(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_h = tl.arange(0, BLOCK_H)
    offs_w = tl.arange(0, BLOCK_W)
    mask_n = offs_n < N
    k_r = offs_n // W
    l_c = offs_n % W
    k = load_tile(k_ptr + bh * N * D, offs_n, mask_n, offs_d, D)
    v = load_tile(v_ptr + bh * N * DV, offs_n, mask_n, offs_dv, DV)
    ca_k = tl.load(ca_ptr + bh * N + offs_n, mask=mask_n, other=0.0)
    cb_k = tl.load(cb_ptr + bh * N + offs_n, mask=mask_n, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    gb = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
    ga = tl.zeros([BLOCK_W, BLOCK_N], tl.float32)
    for start_m in range(0, N, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        mask_m = offs_m < N
        valid = mask_m[:, None] & mask_n[None, :]
        i_q = offs_m // W
        j_q = offs_m % W
        q = load_tile(q_ptr + bh * N * D, offs_m, mask_m, offs_d, D)
        do = load_tile(do_ptr + bh * N * DV, offs_m, mask_m, offs_dv, DV)
        ca_q = tl.load(ca_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
        cb_q = tl.load(cb_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        path = 0
        if V2H:
            lse = tl.load(lse_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
            delta = tl.load(delta_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
            p = _probs(s, ca_ptr + bh * N, cb_ptr + bh * N, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid,
                       lse, W, False)
            dv += tl.dot(tl.trans((w1 * p).to(do.dtype)), do, input_precision=PRECISION)
            ds1 = p * (w1 * dp - delta[:, None])
            ds += ds1
            onehot_i = (i_q[:, None] == offs_h[None, :]).to(tl.float32)  # (BLOCK_M, BLOCK_H)
            gb += tl.dot(tl.trans(onehot_i), ds1, input_precision='ieee')
            path = 1
        if H2V:
            base = path * nbh * N
            lse = tl.load(lse_ptr + base + bh * N + offs_m, mask=mask_m, other=0.0)
            delta = tl.load(delta_ptr + base + bh * N + offs_m, mask=mask_m, other=0.0)
            p = _probs(s, ca_ptr + bh * N, cb_ptr + bh * N, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid,
                       lse, W, True)
            dv += tl.dot(tl.trans((w2 * p).to(do.dtype)), do, input_precision=PRECISION)
            ds2 = p * (w2 * dp - delta[:, None])
            ds += ds2
            onehot_j = (j_q[:, None] == offs_w[None, :]).to(tl.float32)  # (BLOCK_M, BLOCK_W)
            ga += tl.dot(tl.trans(onehot_j), ds2, input_precision='ieee')
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    store_tile(dk_ptr + bh * N * D, offs_n, mask_n, offs_d, D, dk * scale)
    store_tile(dv_ptr + bh * N * DV, offs_n, mask_n, offs_dv, DV, dv)
    if V2H:
        tl.store(gb_ptr + bh * N * H + offs_n[None, :] * H + offs_h[:, None], gb,
                 mask=mask_n[None, :] & (offs_h[:, None] < H))
    if H2V:
        tl.store(ga_ptr + bh * N * W + offs_n[None, :] * W + offs_w[:, None], ga,
                 mask=mask_n[None, :] & (offs_w[:, None] < W))


@triton.jit
def _whole_bwd_q(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, ga_ptr, gb_ptr,
                 scale, w1, w2, N, H, W, D, DV,
                 V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
                 PRECISION: tl.constexpr):
    """One program per query block: dq, and the query-owned table gradients
    ga[p, l] = dSa[i_p, j_p, l] (V2H) and gb[p, k] = dSb[j_p, k, i_p] (H2V)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    nbh = tl.num_programs(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_h = tl.arange(0, BLOCK_H)
    offs_w = tl.arange(0, BLOCK_W)
    mask_m = offs_m < N
    i_q = offs_m // W
    j_q = offs_m % W
    q = load_tile(q_ptr + bh * N * D, offs_m, mask_m, offs_d, D)
    do = load_tile(do_ptr + bh * N * DV, offs_m, mask_m, offs_dv, DV)
    ca_q = tl.load(ca_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
    cb_q = tl.load(cb_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
    lse1 = tl.load(lse_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
    delta1 = tl.load(delta_ptr + bh * N + offs_m, mask=mask_m, other=0.0)
    base2 = nbh * N if V2H else 0
    lse2 = tl.load(lse_ptr + base2 + bh * N + offs_m, mask=mask_m, other=0.0)
    delta2 = tl.load(delta_ptr + base2 + bh * N + offs_m, mask=mask_m, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    ga = tl.zeros([BLOCK_M, BLOCK_W], tl.float32)
    gb = tl.zeros([BLOCK_M, BLOCK_H], tl.float32)
    for start_n in range(0, N, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        valid = mask_m[:, None] & mask_n[None, :]
        k_r = offs_n // W
        l_c = offs_n % W
        k = load_tile(k_ptr + bh * N * D, offs_n, mask_n, offs_d, D)
        v = load_tile(v_ptr + bh * N * DV, offs_n, mask_n, offs_dv, DV)
        ca_k = tl.load(ca_ptr + bh * N + offs_n, mask=mask_n, other=0.0)
        cb_k = tl.load(cb_ptr + bh * N + offs_n, mask=mask_n, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        if V2H:
            p = _probs(s, ca_ptr + bh * N, cb_ptr + bh * N, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid,
                       lse1, W, False)
            ds1 = p * (w1 * dp - delta1[:, None])
            ds += ds1
            onehot_l = (l_c[:, None] == offs_w[None, :]).to(tl.float32)  # (BLOCK_N, BLOCK_W)
            ga += tl.dot(ds1, onehot_l, input_precision='ieee')
        if H2V:
            p = _probs(s, ca_ptr + bh * N, cb_ptr + bh * N, i_q, j_q, k_r, l_c, ca_q, cb_q, ca_k, cb_k, valid,
                       lse2, W, True)
            ds2 = p * (w2 * dp - delta2[:, None])
            ds += ds2
            onehot_k = (k_r[:, None] == offs_h[None, :]).to(tl.float32)  # (BLOCK_N, BLOCK_H)
            gb += tl.dot(ds2, onehot_k, input_precision='ieee')
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    store_tile(dq_ptr + bh * N * D, offs_m, mask_m, offs_d, D, dq * scale)
    if V2H:
        store_tile(ga_ptr + bh * N * W, offs_m, mask_m, offs_w, W, ga)
    if H2V:
        store_tile(gb_ptr + bh * N * H, offs_m, mask_m, offs_h, H, gb)


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


def segment_table_grad(dseg: torch.Tensor) -> torch.Tensor:
    """Adjoint of ``seg[..., t, u] = C[max(t,u)] - C[min(t,u)]``: (..., L, L) -> dC (..., L)."""
    length = dseg.shape[-1]
    idx = torch.arange(length, device=dseg.device)
    sign = torch.where(idx[:, None] >= idx[None, :], 1.0, -1.0).to(dseg.dtype)
    signed = dseg * sign
    return signed.sum(-1) - signed.sum(-2)


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
        ga_q = torch.zeros(bh, n, ww, device=q.device, dtype=torch.float32)
        gb_q = torch.zeros(bh, n, hh, device=q.device, dtype=torch.float32)
        ga_k = torch.zeros(bh, n, ww, device=q.device, dtype=torch.float32)
        gb_k = torch.zeros(bh, n, hh, device=q.device, dtype=torch.float32)
        block_m, block_n = _blocks(n)
        common = (float(scale), weight, weight, n, hh, ww, d, dv_, v2h, h2v)
        tiles = (_pow2(d), _pow2(dv_), _pow2(hh), _pow2(ww), _precision(q.dtype))
        _whole_bwd_kv[(triton.cdiv(n, block_n), bh)](q, k, v, ca, cb, dout, lse, delta, dk, dvv, ga_k, gb_k,
                                                     *common, block_m, block_n, *tiles)
        _whole_bwd_q[(triton.cdiv(n, block_m), bh)](q, k, v, ca, cb, dout, lse, delta, dq, ga_q, gb_q,
                                                    *common, block_m, block_n, *tiles)
        dca = dcb = None
        if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
            # dSa[i, j, l] (row segment table) and dSb[l, i, k] (column segment table)
            dsa = ga_q.reshape(bh, hh, ww, ww) + ga_k.reshape(bh, hh, ww, ww).transpose(-1, -2)
            dsb = gb_k.reshape(bh, hh, ww, hh).permute(0, 2, 3, 1) + gb_q.reshape(bh, hh, ww, hh).transpose(1, 2)
            dca = segment_table_grad(dsa)  # (bh, H, W)
            dcb = segment_table_grad(dsb).transpose(-1, -2)  # (bh, W, H) -> (bh, H, W)
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
