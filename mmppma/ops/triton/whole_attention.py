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
from ._tiles import load_tile, online_softmax_step, sign, slice_offset, store_tile


@triton.jit
def _logits(s, ca_ptr, cb_ptr, qb, kb, W, N, H2V: tl.constexpr, ROWS):
    """Scores plus one path's log-mask for query block ``qb`` and key block ``kb`` (see :func:`_block`).

    V2H: M[p, s] = sgn(j >= l) (Ca[i, j] - Ca[i, l]) + sgn(i >= k) (Cb[i, l] - Cb[k, l]): along the query's row i
    from column j to l, then along column l from row i to k. H2V: M[s, p], the key's row and the query's column
    at the corner. The corner entries (Ca, Cb at (query row, key column) for V2H, at (key row, query column) for
    H2V) come one image row at a time: ROWS rows from the first row of the block that holds them."""
    ca_q, cb_q, i_q, j_q, first_q, mask_m, _ = qb
    ca_k, cb_k, k_r, l_c, first_k, mask_n, _ = kb
    if H2V:
        sa = sign(l_c[None, :] >= j_q[:, None])
        sb = sign(k_r[None, :] >= i_q[:, None])
        x = s + sa * ca_k[None, :] - sb * cb_q[:, None]
        for r in range(ROWS):
            at = (first_k + r) * W + j_q
            va = tl.load(ca_ptr + at, mask=mask_m & (at < N), other=0.0)
            vb = tl.load(cb_ptr + at, mask=mask_m & (at < N), other=0.0)
            x = tl.where((k_r == first_k + r)[None, :], x - sa * va[:, None] + sb * vb[:, None], x)
    else:
        sa = sign(j_q[:, None] >= l_c[None, :])
        sb = sign(i_q[:, None] >= k_r[None, :])
        x = s + sa * ca_q[:, None] - sb * cb_k[None, :]
        for r in range(ROWS):
            at = (first_q + r) * W + l_c
            va = tl.load(ca_ptr + at, mask=mask_n & (at < N), other=0.0)
            vb = tl.load(cb_ptr + at, mask=mask_n & (at < N), other=0.0)
            x = tl.where((i_q == first_q + r)[:, None], x - sa * va[None, :] + sb * vb[None, :], x)
    return x


@triton.jit
def _block(ca_ptr, cb_ptr, start, offs, mask, W):
    """A block of consecutive tokens ``offs`` from ``start``: (Ca, Cb entries, image rows, columns, first image
    row, mask, offsets)."""
    ca = tl.load(ca_ptr + offs, mask=mask, other=0.0)
    cb = tl.load(cb_ptr + offs, mask=mask, other=0.0)
    return ca, cb, offs // W, offs % W, start // W, mask, offs


@triton.jit
def _whole_fwd(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, o_ptr, lse_ptr, scale, N, W, D, DV, ROWS_M, ROWS_N,
               V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """One program per query block: both paths' online softmax over all key blocks; ROWS_M / ROWS_N bound the
    image rows of a query / key block."""
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
            x = tl.where(mask_n[None, :], _logits(s, ca_ptr, cb_ptr, qb, kb, W, N, False, ROWS_M), float('-inf'))
            m1, l1, acc1 = online_softmax_step(x, v, m1, l1, acc1, PRECISION)
        if H2V:
            x = tl.where(mask_n[None, :], _logits(s, ca_ptr, cb_ptr, qb, kb, W, N, True, ROWS_N), float('-inf'))
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
def _score_grads(s, dp, lse_ptr, delta_ptr, rows, cols, ca_ptr, cb_ptr, weight, W, N, H2V: tl.constexpr, ROWS,
                 QUERIES_ON_ROWS: tl.constexpr):
    """One path's recomputed probabilities P and score gradients dS = P * (weight dP - delta) on a tile whose rows
    are the tokens of block ``rows`` and columns those of ``cols`` (see :func:`_block`); the queries are the rows
    (dq) or the columns (dk, dv: the tile is transposed). ``H2V`` and ``ROWS`` as :func:`_logits`."""
    queries = rows if QUERIES_ON_ROWS else cols
    lse = tl.load(lse_ptr + queries[6], mask=queries[5], other=0.0)
    delta = tl.load(delta_ptr + queries[6], mask=queries[5], other=0.0)
    x = _logits(s, ca_ptr, cb_ptr, rows, cols, W, N, H2V, ROWS)
    valid = rows[5][:, None] & cols[5][None, :]
    if QUERIES_ON_ROWS:
        p = tl.where(valid, tl.exp(x - lse[:, None]), 0.0)
        ds = p * (weight * dp - delta[:, None])
    else:
        p = tl.where(valid, tl.exp(x - lse[None, :]), 0.0)
        ds = p * (weight * dp - delta[None, :])
    return p, ds


@triton.jit
def _add_corners(corner_a, corner_b, ds, rows, cols, first, ROWS_OWN: tl.constexpr, BLOCK: tl.constexpr,
                 COLS: tl.constexpr):
    """The gradient of M[r, c] = sgn(j_r >= l_c) (Ca[i_r, j_r] - Ca[i_r, l_c]) + sgn(i_r >= k_c) (Cb[i_r, l_c] - ...)
    at the corners Ca[i_r, l_c], Cb[i_r, l_c] (own row x other column): ``ds`` (BLOCK own tokens, other tokens:
    image rows x COLS columns) folded over the other tile's rows, then summed per own image row into the
    (ROWS_OWN, COLS) accumulators. Also returns the own entry's Ca gradient, sum_c sgn(j_r >= l_c) ds."""
    ge = rows[3][:, None] >= cols[3][None, :]
    folded = tl.sum(tl.reshape(tl.where(ge, -ds, ds), (BLOCK, ds.shape[1] // COLS, COLS)), 1)
    corner_a = _add_row_sums(corner_a, folded, rows[2], first, ROWS_OWN)
    folded = tl.sum(tl.reshape(tl.where(rows[2][:, None] >= cols[2][None, :], ds, -ds),
                               (BLOCK, ds.shape[1] // COLS, COLS)), 1)
    corner_b = _add_row_sums(corner_b, folded, rows[2], first, ROWS_OWN)
    return corner_a, corner_b, tl.sum(tl.where(ge, ds, -ds), 1)


@triton.jit
def _bwd_prologue(q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr, lse_ptr, delta_ptr, N, D, DV):
    """Pointers of this program's (batch * head) slice of every input."""
    bh = tl.program_id(1)
    return (q_ptr + slice_offset(bh, N, D), k_ptr + slice_offset(bh, N, D), v_ptr + slice_offset(bh, N, DV),
            do_ptr + slice_offset(bh, N, DV), ca_ptr + slice_offset(bh, N, 1), cb_ptr + slice_offset(bh, N, 1),
            lse_ptr + slice_offset(bh, N, 1), delta_ptr + slice_offset(bh, N, 1))


@triton.jit
def _tile(ca_ptr, cb_ptr, r0, c0, H, W, BLOCK: tl.constexpr, COLS: tl.constexpr):
    """A 2D tile of tokens: image rows r0.. (BLOCK // COLS of them) x columns c0..c0+COLS, as :func:`_block`."""
    rows = r0 + tl.arange(0, BLOCK) // COLS
    cols = c0 + tl.arange(0, BLOCK) % COLS
    mask = (rows < H) & (cols < W)
    offs = rows * W + cols
    ca = tl.load(ca_ptr + offs, mask=mask, other=0.0)
    cb = tl.load(cb_ptr + offs, mask=mask, other=0.0)
    return ca, cb, rows, cols, r0, mask, offs


@triton.jit
def _add_row_sums(acc, x, own_row, first, ROWS: tl.constexpr):
    """acc (ROWS, COLS) += for each image row ``first + r`` of the own block, the sum of ``x`` (own tokens, COLS)
    over the block's tokens in that row."""
    slot = tl.arange(0, ROWS)[:, None]
    for r in range(ROWS):
        part = tl.sum(tl.where((own_row == first + r)[:, None], x, 0.0), 0)
        acc = tl.where(slot == r, acc + part[None, :], acc)
    return acc


@triton.jit
def _store_corners(ptr, acc, pid, c0, N, W, SLOTS, BLOCK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Store a block's (ROWS, COLS) corner sums (image rows ``first + r`` of the block x table columns
    ``c0 + c``) into slot ``pid - first_block(row)`` of a (H, SLOTS, W) buffer: each (row, slot) has exactly
    one owner program, so the host's sum over slots is deterministic."""
    rows = (pid * BLOCK) // W + tl.arange(0, ROWS)
    cols = c0 + tl.arange(0, COLS)
    slot = pid - (rows * W) // BLOCK
    offsets = (rows[:, None] * SLOTS + slot[:, None]) * W + cols[None, :]
    store = (rows * W < tl.minimum((pid + 1) * BLOCK, N))[:, None] & (cols[None, :] < W)
    tl.store(ptr + offsets, acc, mask=store)


@triton.jit
def _whole_bwd_kv(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                  self_a_ptr, self_b_ptr, corner_a_ptr, corner_b_ptr, scale, weight, N, H, W, D, DV, SLOTS,
                  V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, COLS: tl.constexpr, ROWS_OWN: tl.constexpr,
                  PRECISION: tl.constexpr):
    """One program per key block, one path (V2H or H2V) per launch: dk, dv, and the decay-table gradients the
    keys own: V2H, Cb[k_s, l_s] (the key's own entry); H2V, Ca[k_s, l_s] and the corners Ca[k_s, j_p],
    Cb[k_s, j_p] (key row, query column), summed over the block's keys of each image row. Tiles are transposed
    (keys x queries): H2V's M[s, p] is then V2H's form with the key in the query's place. Queries come in tiles
    of (BLOCK_M // COLS image rows x COLS columns), column chunk by column chunk, so the corners of one chunk
    are complete when its rows are done."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr, lse_ptr, delta_ptr = _bwd_prologue(
        q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr, lse_ptr, delta_ptr, N, D, DV)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_n = offs_n < N
    k = load_tile(k_ptr, offs_n, mask_n, offs_d, D)
    v = load_tile(v_ptr, offs_n, mask_n, offs_dv, DV)
    kb = _block(ca_ptr, cb_ptr, pid_n * BLOCK_N, offs_n, mask_n, W)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    self_own = tl.zeros([BLOCK_N], tl.float32)  # V2H: Cb at the key; H2V: Ca at the key
    corner_ptr = slice_offset(bh, H * SLOTS, W)
    for c0 in range(0, W, COLS):
        corner_a = tl.zeros([ROWS_OWN, COLS], tl.float32)
        corner_b = tl.zeros([ROWS_OWN, COLS], tl.float32)
        for r0 in range(0, H, BLOCK_M // COLS):
            qb = _tile(ca_ptr, cb_ptr, r0, c0, H, W, BLOCK_M, COLS)
            q = load_tile(q_ptr, qb[6], qb[5], offs_d, D)
            do = load_tile(do_ptr, qb[6], qb[5], offs_dv, DV)
            s = tl.dot(k, tl.trans(q), input_precision=PRECISION) * scale
            dp = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            if V2H:  # M[p, s] on the transposed tile: H2V's form, the query tile's rows at the corners
                p, ds = _score_grads(s, dp, lse_ptr, delta_ptr, kb, qb, ca_ptr, cb_ptr, weight, W, N, True,
                                     BLOCK_M // COLS, False)
                self_own -= tl.sum(tl.where(qb[2][None, :] >= kb[2][:, None], ds, -ds), 1)
            else:
                p, ds = _score_grads(s, dp, lse_ptr, delta_ptr, kb, qb, ca_ptr, cb_ptr, weight, W, N, False,
                                     ROWS_OWN, False)
                corner_a, corner_b, own = _add_corners(corner_a, corner_b, ds, kb, qb, kb[4], ROWS_OWN, BLOCK_N,
                                                       COLS)
                self_own += own
            dv += tl.dot((weight * p).to(do.dtype), do, input_precision=PRECISION)
            dk += tl.dot(ds.to(q.dtype), q, input_precision=PRECISION)
        if H2V:
            _store_corners(corner_a_ptr + corner_ptr, corner_a, pid_n, c0, N, W, SLOTS, BLOCK_N, ROWS_OWN, COLS)
            _store_corners(corner_b_ptr + corner_ptr, corner_b, pid_n, c0, N, W, SLOTS, BLOCK_N, ROWS_OWN, COLS)
    store_tile(dk_ptr + slice_offset(bh, N, D), offs_n, mask_n, offs_d, D, dk * scale)
    store_tile(dv_ptr + slice_offset(bh, N, DV), offs_n, mask_n, offs_dv, DV, dv)
    tl.store((self_b_ptr if V2H else self_a_ptr) + slice_offset(bh, N, 1) + offs_n, self_own, mask=mask_n)


@triton.jit
def _whole_bwd_q(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                 self_a_ptr, self_b_ptr, corner_a_ptr, corner_b_ptr, scale, weight, N, H, W, D, DV, SLOTS,
                 V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, COLS: tl.constexpr, ROWS_OWN: tl.constexpr,
                 PRECISION: tl.constexpr):
    """One program per query block, one path per launch: dq, and the decay-table gradients the queries own:
    H2V, Cb[i_p, j_p] (the query's own entry); V2H, Ca[i_p, j_p] and the corners Ca[i_p, l_s], Cb[i_p, l_s]
    (query row, key column), summed over the block's queries of each image row. Keys come in tiles of
    (BLOCK_N // COLS image rows x COLS columns), column chunk by column chunk."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr, lse_ptr, delta_ptr = _bwd_prologue(
        q_ptr, k_ptr, v_ptr, do_ptr, ca_ptr, cb_ptr, lse_ptr, delta_ptr, N, D, DV)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_m = offs_m < N
    q = load_tile(q_ptr, offs_m, mask_m, offs_d, D)
    do = load_tile(do_ptr, offs_m, mask_m, offs_dv, DV)
    qb = _block(ca_ptr, cb_ptr, pid_m * BLOCK_M, offs_m, mask_m, W)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    self_own = tl.zeros([BLOCK_M], tl.float32)  # V2H: Ca at the query; H2V: Cb at the query
    corner_ptr = slice_offset(bh, H * SLOTS, W)
    for c0 in range(0, W, COLS):
        corner_a = tl.zeros([ROWS_OWN, COLS], tl.float32)
        corner_b = tl.zeros([ROWS_OWN, COLS], tl.float32)
        for r0 in range(0, H, BLOCK_N // COLS):
            kb = _tile(ca_ptr, cb_ptr, r0, c0, H, W, BLOCK_N, COLS)
            k = load_tile(k_ptr, kb[6], kb[5], offs_d, D)
            v = load_tile(v_ptr, kb[6], kb[5], offs_dv, DV)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            if V2H:
                p, ds = _score_grads(s, dp, lse_ptr, delta_ptr, qb, kb, ca_ptr, cb_ptr, weight, W, N, False,
                                     ROWS_OWN, True)
                corner_a, corner_b, own = _add_corners(corner_a, corner_b, ds, qb, kb, qb[4], ROWS_OWN, BLOCK_M,
                                                       COLS)
                self_own += own
            else:
                p, ds = _score_grads(s, dp, lse_ptr, delta_ptr, qb, kb, ca_ptr, cb_ptr, weight, W, N, True,
                                     BLOCK_N // COLS, True)
                self_own -= tl.sum(tl.where(kb[2][None, :] >= qb[2][:, None], ds, -ds), 1)
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        if V2H:
            _store_corners(corner_a_ptr + corner_ptr, corner_a, pid_m, c0, N, W, SLOTS, BLOCK_M, ROWS_OWN, COLS)
            _store_corners(corner_b_ptr + corner_ptr, corner_b, pid_m, c0, N, W, SLOTS, BLOCK_M, ROWS_OWN, COLS)
    store_tile(dq_ptr + slice_offset(bh, N, D), offs_m, mask_m, offs_d, D, dq * scale)
    tl.store((self_a_ptr if V2H else self_b_ptr) + slice_offset(bh, N, 1) + offs_m, self_own, mask=mask_m)


def _rows(block: int, h: int, w: int) -> int:
    """Image rows a block of ``block`` consecutive tokens can touch, rounded up to a power of two."""
    return lp.pow2(min(h, (block - 1) // w + 2), 1)


def forward_launches(q, k, v, ca, cb, scale: float, v2h: bool, h2v: bool, cap: int):
    """The forward's launch and its outputs (o: (paths, BH, N, dv), lse: (paths, BH, N), float32)."""
    bh, n, d = q.shape
    dv = v.shape[-1]
    hh, ww = ca.shape[-2:]
    paths = int(v2h) + int(h2v)
    o = torch.empty(paths, bh, n, dv, device=q.device, dtype=torch.float32)
    lse = torch.empty(paths, bh, n, device=q.device, dtype=torch.float32)
    cfg = lp.config('whole_fwd', n, q.dtype, cap)
    launch = lp.Launch(_whole_fwd, (triton.cdiv(n, cfg.block_m), bh),
                       (q, k, v, ca, cb, o, lse, float(scale), n, ww, d, dv, _rows(cfg.block_m, hh, ww),
                        _rows(cfg.block_n, hh, ww)),
                       dict(V2H=v2h, H2V=h2v, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=lp.pow2(d),
                            BLOCK_DV=lp.pow2(dv), PRECISION=lp.precision(q.dtype)), cfg)
    return [launch], o, lse


def backward_launches(q, k, v, ca, cb, o, lse, dout, scale: float, v2h: bool, h2v: bool, cap: int):
    """The backward's launches, one pair per path, and the buffers they fill: dq, dk, dv per path
    (paths, BH, N, .) float32, and the table-gradient parts (each token's own entries ``self_q``, ``self_k``:
    (2, BH, N); corner slots ``corner_k``, ``corner_q``: (2, BH, H, SLOTS, W); index 0 is Ca, 1 is Cb)."""
    bh, n, d = q.shape
    dv = v.shape[-1]
    hh, ww = ca.shape[-2:]
    paths = [flags for flags, on in (((True, False), v2h), ((False, True), h2v)) if on]
    weight = 1.0 / len(paths)
    # delta_p = rowsum(dP_p * P_p) = weight * (dout . o_p)
    delta = (weight * (dout.float().unsqueeze(0) * o).sum(-1)).contiguous()
    zeros = dict(device=q.device, dtype=torch.float32)
    dq = torch.empty(len(paths), *q.shape, **zeros)
    dk = torch.empty(len(paths), *k.shape, **zeros)
    dvv = torch.empty(len(paths), *v.shape, **zeros)
    cfg_kv, cfg_q = (lp.config(family, n, q.dtype, cap, ww) for family in ('whole_bwd_kv', 'whole_bwd_q'))
    self_q, self_k = torch.zeros(2, bh, n, **zeros), torch.zeros(2, bh, n, **zeros)
    slots = [(ww - 1) // own + 2 for own in (cfg_kv.block_n, cfg_q.block_m)]  # blocks one image row can touch
    corner_k, corner_q = (torch.zeros(2, bh, hh, s, ww, **zeros) for s in slots)
    launches = []
    for i, (p_v2h, p_h2v) in enumerate(paths):
        for kernel, cfg, own, other, grads, selfs, corner, nslots in (
                (_whole_bwd_kv, cfg_kv, cfg_kv.block_n, cfg_kv.block_m, (dk[i], dvv[i]), self_k, corner_k, slots[0]),
                (_whole_bwd_q, cfg_q, cfg_q.block_m, cfg_q.block_n, (dq[i], ), self_q, corner_q, slots[1])):
            launches.append(lp.Launch(
                kernel, (triton.cdiv(n, own), bh),
                (q, k, v, ca, cb, dout, lse[i], delta[i], *grads, selfs[0], selfs[1], corner[0], corner[1],
                 float(scale), weight, n, hh, ww, d, dv, nslots),
                dict(V2H=p_v2h, H2V=p_h2v, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=lp.pow2(d),
                     BLOCK_DV=lp.pow2(dv), COLS=min(other, lp.pow2(ww, 1)), ROWS_OWN=_rows(own, hh, ww),
                     PRECISION=lp.precision(q.dtype)), cfg))
    return launches, (dq, dk, dvv, self_q, self_k, corner_k, corner_q)


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
        return (dq.sum(0).to(q.dtype), dk.sum(0).to(k.dtype), dvv.sum(0).to(v.dtype), dca, dcb, None, None,
                None)


def whole_attention_triton(q, k, v, ca, cb, scale: float, v2h: bool = True, h2v: bool = True):
    """q, k: (B, heads, H, W, d); v: (B, heads, H, W, dv); ca, cb: (B, heads, H, W) float32 cumsums."""
    b, heads, hh, ww, d = q.shape
    bh = b * heads
    out = WholeAttentionFunction.apply(
        q.reshape(bh, hh * ww, d).contiguous(), k.reshape(bh, hh * ww, d).contiguous(),
        v.reshape(bh, hh * ww, v.shape[-1]).contiguous(), ca.reshape(bh, hh, ww).float().contiguous(),
        cb.reshape(bh, hh, ww).float().contiguous(), scale, v2h, h2v)
    return out.reshape(b, heads, hh, ww, v.shape[-1])
