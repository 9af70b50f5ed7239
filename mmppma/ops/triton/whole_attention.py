"""Fused whole polyline-masked attention (PPMVA, release form) - forward and backward, no N x N tensor.

Scores ``S = scale * q k^T`` are computed once per tile; each path's bias (V2H: M, H2V: M^T) is built in
registers from the O(N) cumsum tables Ca (rows) and Cb (columns), and each path keeps its own online softmax.
A bias reads each table at a token's own entry and at a "corner" (the query's row and the key's column for V2H,
the reverse for H2V). A block of consecutive tokens covers at most ROWS image rows, so a tile's corners are a
(ROWS x key columns) slab: one gathered vector per image row, selected by row.

The backward recomputes the tiles and reduces the bias gradient onto the tables: own entries as row sums of the
score gradient, corners by two one-hot ``tl.dot`` into a (ROWS, BLOCK_W) accumulator per block (image rows of
the block x table columns), stored in one slot per (row, block). The host sums the slots: no atomics,
deterministic, extra memory O(N).

Token p = i*W + j. V2H: M[p, s] = Sa(i_p; j_p, l_s) + Sb(l_s; i_p, k_s); H2V: M[s, p].
"""
import torch
import triton
import triton.language as tl

from . import launch as lp
from ._tiles import load_tile, online_softmax_step, seg, sign, slice_offset, store_tile


@triton.jit
def _corners(ca_ptr, cb_ptr, tile, i_q, j_q, k_r, l_c, first_q, first_k, mask_m, mask_n, W, N,
             H2V: tl.constexpr, ROWS: tl.constexpr):
    """Ca and Cb at (query row, key column) for V2H, at (key row, query column) for H2V, as tiles shaped like
    ``tile``: the block whose rows index the tables spans at most ROWS image rows from ``first_*``."""
    ta = tl.zeros_like(tile)
    tb = tl.zeros_like(tile)
    for r in tl.static_range(ROWS):
        if H2V:
            row = first_k + r
            at = row * W + j_q
            va = tl.load(ca_ptr + at, mask=mask_m & (at < N), other=0.0)
            vb = tl.load(cb_ptr + at, mask=mask_m & (at < N), other=0.0)
            hit = (k_r == row)[None, :]
            ta = tl.where(hit, va[:, None], ta)
            tb = tl.where(hit, vb[:, None], tb)
        else:
            row = first_q + r
            at = row * W + l_c
            va = tl.load(ca_ptr + at, mask=mask_n & (at < N), other=0.0)
            vb = tl.load(cb_ptr + at, mask=mask_n & (at < N), other=0.0)
            hit = (i_q == row)[:, None]
            ta = tl.where(hit, va[None, :], ta)
            tb = tl.where(hit, vb[None, :], tb)
    return ta, tb


@triton.jit
def _bias(ca_ptr, cb_ptr, tile, qb, kb, W, N, H2V: tl.constexpr, ROWS: tl.constexpr):
    """Log-mask tile of one path for query block ``qb`` and key block ``kb`` (see :func:`_block`)."""
    ca_q, cb_q, i_q, j_q, first_q, mask_m = qb
    ca_k, cb_k, k_r, l_c, first_k, mask_n = kb
    ta, tb = _corners(ca_ptr, cb_ptr, tile, i_q, j_q, k_r, l_c, first_q, first_k, mask_m, mask_n, W, N, H2V, ROWS)
    if H2V:  # M[s, p]: along the key's row k from column l to j, then along column j from row k to i
        return (seg(ca_k[None, :], ta, l_c[None, :] >= j_q[:, None])
                + seg(tb, cb_q[:, None], k_r[None, :] >= i_q[:, None]))
    # M[p, s]: along the query's row i from column j to l, then along column l from row i to k
    return seg(ca_q[:, None], ta, j_q[:, None] >= l_c[None, :]) + seg(tb, cb_k[None, :], i_q[:, None] >= k_r[None, :])


@triton.jit
def _block(ca_ptr, cb_ptr, start, offs, mask, W):
    """Table entries, image rows and columns of the block of tokens ``offs`` from ``start``, its first image row,
    and its mask."""
    ca = tl.load(ca_ptr + offs, mask=mask, other=0.0)
    cb = tl.load(cb_ptr + offs, mask=mask, other=0.0)
    return ca, cb, offs // W, offs % W, start // W, mask


@triton.jit
def _whole_fwd(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, o_ptr, lse_ptr, scale, N, W, D, DV,
               V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ROWS_M: tl.constexpr, ROWS_N: tl.constexpr,
               PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    q_ptr += slice_offset(bh, N, D)
    k_ptr += slice_offset(bh, N, D)
    v_ptr += slice_offset(bh, N, DV)
    ca_ptr += slice_offset(bh, N, 1)
    cb_ptr += slice_offset(bh, N, 1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_m = offs_m < N
    q = load_tile(q_ptr, offs_m, mask_m, offs_d, D)
    qb = _block(ca_ptr, cb_ptr, pid_m * BLOCK_M, offs_m, mask_m, W)
    m1 = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    m2 = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l2 = tl.zeros([BLOCK_M], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start_n in range(0, N, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        k = load_tile(k_ptr, offs_n, mask_n, offs_d, D)
        v = load_tile(v_ptr, offs_n, mask_n, offs_dv, DV)
        kb = _block(ca_ptr, cb_ptr, start_n, offs_n, mask_n, W)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if V2H:
            x = tl.where(mask_n[None, :], s + _bias(ca_ptr, cb_ptr, s, qb, kb, W, N, False, ROWS_M), float('-inf'))
            m1, l1, acc1 = online_softmax_step(x, v, m1, l1, acc1, PRECISION)
        if H2V:
            x = tl.where(mask_n[None, :], s + _bias(ca_ptr, cb_ptr, s, qb, kb, W, N, True, ROWS_N), float('-inf'))
            m2, l2, acc2 = online_softmax_step(x, v, m2, l2, acc2, PRECISION)
    o_ptr += slice_offset(bh, N, DV)
    lse_ptr += slice_offset(bh, N, 1)
    if V2H:
        store_tile(o_ptr, offs_m, mask_m, offs_dv, DV, acc1 / l1[:, None])
        tl.store(lse_ptr + offs_m, m1 + tl.log(l1), mask=mask_m)
        # the H2V path's slices follow the V2H path's
        o_ptr += slice_offset(tl.num_programs(1), N, DV)
        lse_ptr += slice_offset(tl.num_programs(1), N, 1)
    if H2V:
        store_tile(o_ptr, offs_m, mask_m, offs_dv, DV, acc2 / l2[:, None])
        tl.store(lse_ptr + offs_m, m2 + tl.log(l2), mask=mask_m)


@triton.jit
def _path_grads(s, dp, lse_ptr, delta_ptr, offs_m, ca_ptr, cb_ptr, qb, kb, weight, W, N, H2V: tl.constexpr,
                ROWS: tl.constexpr):
    """One path's recomputed probabilities P and score gradients dS = P * (weight dP - delta) on one tile."""
    mask_m = qb[5]
    lse = tl.load(lse_ptr + offs_m, mask=mask_m, other=0.0)
    delta = tl.load(delta_ptr + offs_m, mask=mask_m, other=0.0)
    x = s + _bias(ca_ptr, cb_ptr, s, qb, kb, W, N, H2V, ROWS)
    p = tl.where(mask_m[:, None] & kb[5][None, :], tl.exp(x - lse[:, None]), 0.0)
    return p, p * (weight * dp - delta[:, None])


@triton.jit
def _bwd_prologue(q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr, bh, N, D, DV):
    """Pointers of slice ``bh`` of every input."""
    return (q_ptr + slice_offset(bh, N, D), k_ptr + slice_offset(bh, N, D), v_ptr + slice_offset(bh, N, DV),
            do_ptr + slice_offset(bh, N, DV), ca_ptr + slice_offset(bh, N, 1), cb_ptr + slice_offset(bh, N, 1))


@triton.jit
def _store_corners(ptr, acc, pid, N, W, SLOTS, BLOCK: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
    """Store a block's (ROWS, BLOCK_W) corner sums (image rows ``first + r`` of the block x table columns) into
    slot ``pid - first_block(row)`` of a (H, SLOTS, W) buffer: each (row, slot) has exactly one owner program,
    so the host's sum over slots is deterministic."""
    rows = (pid * BLOCK) // W + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_W)
    slot = pid - (rows * W) // BLOCK
    offsets = (rows[:, None] * SLOTS + slot[:, None]) * W + cols[None, :]
    store = (rows * W < tl.minimum((pid + 1) * BLOCK, N))[:, None] & (cols[None, :] < W)
    tl.store(ptr + offsets, acc, mask=store)


@triton.jit
def _whole_bwd_kv(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                  self_a_ptr, self_b_ptr, corner_a_ptr, corner_b_ptr, scale, w1, w2, N, H, W, D, DV, SLOTS,
                  V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_W: tl.constexpr, ROWS_M: tl.constexpr,
                  ROWS_N: tl.constexpr, ROWS_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """One program per key block: dk, dv, and the decay-table gradients the keys own:
    V2H, Cb[k_s, l_s] (the key's own entry); H2V, Ca[k_s, l_s] and the corners Ca[k_s, j_p], Cb[k_s, j_p]
    (key row, query column), summed over the block's keys of each image row."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr = _bwd_prologue(q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr, bh,
                                                                N, D, DV)
    lse_ptr += slice_offset(bh, N, 1)
    delta_ptr += slice_offset(bh, N, 1)
    stride_path = slice_offset(tl.num_programs(1), N, 1) if V2H else 0  # the H2V path's lse / delta
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_w = tl.arange(0, BLOCK_W)
    mask_n = offs_n < N
    k = load_tile(k_ptr, offs_n, mask_n, offs_d, D)
    v = load_tile(v_ptr, offs_n, mask_n, offs_dv, DV)
    kb = _block(ca_ptr, cb_ptr, pid_n * BLOCK_N, offs_n, mask_n, W)
    k_r, l_c = kb[2], kb[3]
    # key block rows one-hot: (BLOCK_N, ROWS_DOT)
    onehot_k = (k_r[:, None] == kb[4] + tl.arange(0, ROWS_DOT)[None, :]).to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    self_a = tl.zeros([BLOCK_N], tl.float32)  # H2V: Ca at the key
    self_b = tl.zeros([BLOCK_N], tl.float32)  # V2H: Cb at the key
    corner_a = tl.zeros([ROWS_DOT, BLOCK_W], tl.float32)
    corner_b = tl.zeros([ROWS_DOT, BLOCK_W], tl.float32)
    for start_m in range(0, N, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        mask_m = offs_m < N
        q = load_tile(q_ptr, offs_m, mask_m, offs_d, D)
        do = load_tile(do_ptr, offs_m, mask_m, offs_dv, DV)
        qb = _block(ca_ptr, cb_ptr, start_m, offs_m, mask_m, W)
        i_q, j_q = qb[2], qb[3]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        pw = tl.zeros_like(s)
        ds = tl.zeros_like(s)
        if V2H:
            p, d1 = _path_grads(s, dp, lse_ptr, delta_ptr, offs_m, ca_ptr, cb_ptr, qb, kb, w1, W, N, False, ROWS_M)
            pw += w1 * p
            ds += d1
            self_b -= tl.sum(d1 * sign(i_q[:, None] >= k_r[None, :]), 0)
        if H2V:
            p, d2 = _path_grads(s, dp, lse_ptr + stride_path, delta_ptr + stride_path, offs_m, ca_ptr, cb_ptr,
                                qb, kb, w2, W, N, True, ROWS_N)
            pw += w2 * p
            ds += d2
            sa = sign(l_c[None, :] >= j_q[:, None])
            self_a += tl.sum(sa * d2, 0)
            # Ca[k, l] - Ca[k, j] if l >= j else the reverse: corner (k_s, j_p) gets -sa; Cb corner gets +sb
            onehot_j = (j_q[:, None] == offs_w[None, :]).to(tl.float32)  # (BLOCK_M, BLOCK_W)
            per_row = tl.dot(-sa * d2, onehot_k, input_precision='ieee')  # (BLOCK_M, ROWS_DOT)
            corner_a += tl.dot(tl.trans(per_row), onehot_j, input_precision='ieee')
            per_row = tl.dot(d2 * sign(k_r[None, :] >= i_q[:, None]), onehot_k, input_precision='ieee')
            corner_b += tl.dot(tl.trans(per_row), onehot_j, input_precision='ieee')
        dv += tl.dot(tl.trans(pw.to(do.dtype)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    store_tile(dk_ptr + slice_offset(bh, N, D), offs_n, mask_n, offs_d, D, dk * scale)
    store_tile(dv_ptr + slice_offset(bh, N, DV), offs_n, mask_n, offs_dv, DV, dv)
    if V2H:
        tl.store(self_b_ptr + slice_offset(bh, N, 1) + offs_n, self_b, mask=mask_n)
    if H2V:
        tl.store(self_a_ptr + slice_offset(bh, N, 1) + offs_n, self_a, mask=mask_n)
        _store_corners(corner_a_ptr + slice_offset(bh, H * SLOTS, W), corner_a, pid_n, N, W, SLOTS, BLOCK_N,
                       ROWS_DOT, BLOCK_W)
        _store_corners(corner_b_ptr + slice_offset(bh, H * SLOTS, W), corner_b, pid_n, N, W, SLOTS, BLOCK_N,
                       ROWS_DOT, BLOCK_W)


@triton.jit
def _whole_bwd_q(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                 self_a_ptr, self_b_ptr, corner_a_ptr, corner_b_ptr, scale, w1, w2, N, H, W, D, DV, SLOTS,
                 V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_W: tl.constexpr, ROWS_M: tl.constexpr,
                 ROWS_N: tl.constexpr, ROWS_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """One program per query block: dq, and the decay-table gradients the queries own:
    H2V, Cb[i_p, j_p] (the query's own entry); V2H, Ca[i_p, j_p] and the corners Ca[i_p, l_s], Cb[i_p, l_s]
    (query row, key column), summed over the block's queries of each image row."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr = _bwd_prologue(q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr, bh,
                                                                N, D, DV)
    lse_ptr += slice_offset(bh, N, 1)
    delta_ptr += slice_offset(bh, N, 1)
    stride_path = slice_offset(tl.num_programs(1), N, 1) if V2H else 0
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_w = tl.arange(0, BLOCK_W)
    mask_m = offs_m < N
    q = load_tile(q_ptr, offs_m, mask_m, offs_d, D)
    do = load_tile(do_ptr, offs_m, mask_m, offs_dv, DV)
    qb = _block(ca_ptr, cb_ptr, pid_m * BLOCK_M, offs_m, mask_m, W)
    i_q, j_q = qb[2], qb[3]
    # query block rows one-hot: (ROWS_DOT, BLOCK_M)
    onehot_q = (qb[4] + tl.arange(0, ROWS_DOT)[:, None] == i_q[None, :]).to(tl.float32)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    self_a = tl.zeros([BLOCK_M], tl.float32)  # V2H: Ca at the query
    self_b = tl.zeros([BLOCK_M], tl.float32)  # H2V: Cb at the query
    corner_a = tl.zeros([ROWS_DOT, BLOCK_W], tl.float32)
    corner_b = tl.zeros([ROWS_DOT, BLOCK_W], tl.float32)
    for start_n in range(0, N, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        k = load_tile(k_ptr, offs_n, mask_n, offs_d, D)
        v = load_tile(v_ptr, offs_n, mask_n, offs_dv, DV)
        kb = _block(ca_ptr, cb_ptr, start_n, offs_n, mask_n, W)
        k_r, l_c = kb[2], kb[3]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = tl.zeros_like(s)
        if V2H:
            p, d1 = _path_grads(s, dp, lse_ptr, delta_ptr, offs_m, ca_ptr, cb_ptr, qb, kb, w1, W, N, False, ROWS_M)
            ds += d1
            sa = sign(j_q[:, None] >= l_c[None, :])
            self_a += tl.sum(sa * d1, 1)
            # Ca[i, j] - Ca[i, l] if j >= l else the reverse: corner (i_p, l_s) gets -sa; Cb corner gets +sb
            onehot_l = (l_c[:, None] == offs_w[None, :]).to(tl.float32)  # (BLOCK_N, BLOCK_W)
            per_row = tl.dot(onehot_q, -sa * d1, input_precision='ieee')  # (ROWS_DOT, BLOCK_N)
            corner_a += tl.dot(per_row, onehot_l, input_precision='ieee')
            per_row = tl.dot(onehot_q, d1 * sign(i_q[:, None] >= k_r[None, :]), input_precision='ieee')
            corner_b += tl.dot(per_row, onehot_l, input_precision='ieee')
        if H2V:
            p, d2 = _path_grads(s, dp, lse_ptr + stride_path, delta_ptr + stride_path, offs_m, ca_ptr, cb_ptr,
                                qb, kb, w2, W, N, True, ROWS_N)
            ds += d2
            self_b -= tl.sum(d2 * sign(k_r[None, :] >= i_q[:, None]), 1)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    store_tile(dq_ptr + slice_offset(bh, N, D), offs_m, mask_m, offs_d, D, dq * scale)
    if V2H:
        tl.store(self_a_ptr + slice_offset(bh, N, 1) + offs_m, self_a, mask=mask_m)
        _store_corners(corner_a_ptr + slice_offset(bh, H * SLOTS, W), corner_a, pid_m, N, W, SLOTS, BLOCK_M,
                       ROWS_DOT, BLOCK_W)
        _store_corners(corner_b_ptr + slice_offset(bh, H * SLOTS, W), corner_b, pid_m, N, W, SLOTS, BLOCK_M,
                       ROWS_DOT, BLOCK_W)
    if H2V:
        tl.store(self_b_ptr + slice_offset(bh, N, 1) + offs_m, self_b, mask=mask_m)


def _rows(block: int, h: int, w: int) -> int:
    """Image rows a block of ``block`` consecutive tokens can touch, rounded up to a power of two."""
    return lp.pow2(min(h, (block - 1) // w + 2), 1)


def _tile_constexprs(cfg: lp.Config, h: int, w: int, d: int, dv: int, dtype: torch.dtype) -> dict:
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=lp.pow2(d), BLOCK_DV=lp.pow2(dv),
                ROWS_M=_rows(cfg.block_m, h, w), ROWS_N=_rows(cfg.block_n, h, w), PRECISION=lp.precision(dtype))


def forward_launches(q, k, v, ca, cb, scale: float, v2h: bool, h2v: bool, cap: int):
    """The forward's launches and its outputs (o: (paths, BH, N, dv), lse: (paths, BH, N), float32)."""
    bh, n, d = q.shape
    dv = v.shape[-1]
    hh, ww = ca.shape[-2:]
    paths = int(v2h) + int(h2v)
    o = torch.empty(paths, bh, n, dv, device=q.device, dtype=torch.float32)
    lse = torch.empty(paths, bh, n, device=q.device, dtype=torch.float32)
    cfg = lp.config('whole_fwd', n, q.dtype, cap)
    launch = lp.Launch(_whole_fwd, (triton.cdiv(n, cfg.block_m), bh),
                       (q, k, v, ca, cb, o, lse, float(scale), n, ww, d, dv),
                       dict(V2H=v2h, H2V=h2v, **_tile_constexprs(cfg, hh, ww, d, dv, q.dtype)), cfg)
    return [launch], o, lse


def backward_launches(q, k, v, ca, cb, o, lse, dout, scale: float, v2h: bool, h2v: bool, cap: int):
    """The backward's launches and the buffers they fill: dq, dk, dv (float32) and the table-gradient parts
    (each token's own entries ``self_q``, ``self_k``: (2, BH, N); corner slots ``corner_q``, ``corner_k``:
    (2, BH, H, SLOTS, W); index 0 is Ca, 1 is Cb)."""
    bh, n, d = q.shape
    dv = v.shape[-1]
    hh, ww = ca.shape[-2:]
    paths = o.shape[0]
    weight = 1.0 / paths
    # delta_p = rowsum(dP_p * P_p) = weight * (dout . o_p)
    delta = (weight * (dout.float().unsqueeze(0) * o).sum(-1)).contiguous()
    dq = torch.empty_like(q, dtype=torch.float32)
    dk = torch.empty_like(k, dtype=torch.float32)
    dvv = torch.empty_like(v, dtype=torch.float32)
    cfg = lp.config('whole_bwd', n, q.dtype, cap)
    tiles = _tile_constexprs(cfg, hh, ww, d, dv, q.dtype)
    zeros = dict(device=q.device, dtype=torch.float32)
    self_q, self_k = torch.zeros(2, bh, n, **zeros), torch.zeros(2, bh, n, **zeros)
    launches, corners = [], []
    for kernel, block, grads, own in ((_whole_bwd_kv, cfg.block_n, (dk, dvv), self_k),
                                      (_whole_bwd_q, cfg.block_m, (dq, ), self_q)):
        slots = (ww - 1) // block + 2  # blocks one image row can touch
        corner = torch.zeros(2, bh, hh, slots, ww, **zeros)
        rows_dot = max(16, tiles['ROWS_N' if kernel is _whole_bwd_kv else 'ROWS_M'])
        launches.append(lp.Launch(
            kernel, (triton.cdiv(n, block), bh),
            (q, k, v, ca, cb, dout, lse, delta, *grads, own[0], own[1], corner[0], corner[1], float(scale), weight,
             weight, n, hh, ww, d, dv, slots),
            dict(V2H=v2h, H2V=h2v, BLOCK_W=lp.pow2(ww), ROWS_DOT=rows_dot, **tiles), cfg))
        corners.append(corner)
    return launches, (dq, dk, dvv, self_q, self_k, *corners)


class WholeAttentionFunction(torch.autograd.Function):
    """Autograd wrapper of the fused kernels. Inputs are flattened per (batch*head): q, k (BH, N, d),
    v (BH, N, dv), Ca, Cb (BH, H, W) float32 cumsum tables."""

    @staticmethod
    def forward(ctx, q, k, v, ca, cb, scale: float, v2h: bool, h2v: bool):
        launches, o, lse = forward_launches(q, k, v, ca, cb, scale, v2h, h2v, lp.capability(q.device))
        lp.run(launches)
        out = o.mean(0)  # equal weights: 1 path -> itself, 2 paths -> the release's average
        ctx.save_for_backward(q, k, v, ca, cb, o, lse)
        ctx.args = (float(scale), v2h, h2v)
        return out.to(v.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, ca, cb, o, lse = ctx.saved_tensors
        scale, v2h, h2v = ctx.args
        bh, hh, ww = ca.shape
        launches, (dq, dk, dvv, self_q, self_k, corner_k, corner_q) = backward_launches(
            q, k, v, ca, cb, o, lse, dout.contiguous(), scale, v2h, h2v, lp.capability(q.device))
        lp.run(launches)
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
