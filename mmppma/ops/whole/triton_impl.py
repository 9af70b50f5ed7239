"""Whole attention, Triton kernels: the softmax forms of PPMVA (and RMT's Manhattan attention), forward and
backward, no N x N tensor.

One launch per path: scores ``S = scale * q k^T`` per tile plus the path's bias (``'v2h'``: M, ``'h2v'``: M^T),
built in registers from the O(N) cumsum tables Ca (rows) and Cb (columns), under an online softmax. A bias reads
each table at a token's own entry and at a "corner" (the query's row and the key's column for V2H, the reverse for
H2V).

The forward runs every path as V2H (H2V is V2H on the transposed map, with the two tables swapped: the host
transposes q, k, v and the tables for it) on query tiles of one image row, so that the corner entries are per-key
vectors (see :func:`_whole_fwd`). The backward takes the path as its ``FORM`` constexpr (Triton takes string
constexprs) and blocks of consecutive tokens, which cover at most ROWS image rows: a tile's corners are a (ROWS x
key columns) slab, one gathered vector per image row, selected by row.

The backward recomputes the tiles and reduces the bias gradient onto the tables: own entries as row sums of the
score gradient; corners per own image row, each tile's share summed over the block's tokens of that row by a
one-hot matrix product, accumulated over the other tiles of a column chunk and stored into the program's own
slot of a (H, SLOTS, W) buffer. The host sums the slots: no atomics, deterministic, extra memory O(N).

Token p = i*W + j. V2H: M[p, s] = Sa(i_p; j_p, l_s) + Sb(l_s; i_p, k_s); H2V: M[s, p].
"""
from typing import Tuple

import torch
import triton
import triton.language as tl

from ..forms import paths, transposed
from ..triton_support import launch as lp
from ..triton_support.tiles import (
    bwd_operands,
    load_tile,
    online_softmax_step,
    slice_offset,
    store_tile,
    token_block,
)

LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)  # the kernels' (a plain global is not a constant to triton)


@triton.jit
def _logits(s, ca_ptr, cb_ptr, qb, kb, W, N, FORM: tl.constexpr, ROWS):
    """Scores plus one path's log-mask for query block ``qb`` and key block ``kb`` (see :func:`_block`).

    V2H: M[p, s] = -|Ca[i, j] - Ca[i, l]| - |Cb[i, l] - Cb[k, l]|: along the query's row i from column j to l,
    then along column l from row i to k (the log-decays are <= 0, so the tables are monotone along their lines and
    a segment's sum is minus the absolute difference of its ends). H2V: M[s, p], the key's row and the query's
    column at the corner. The corner entries (Ca, Cb at (query row, key column) for V2H, at (key row, query
    column) for H2V) come one image row at a time: ROWS rows from the first row of the block that holds them.
    Each row adds its terms where it holds the corner: no per-element corner tile stays live. The block whose
    rows are not the corners' reads its tables as +inf past the map: a bias of -inf there."""
    for r in range(ROWS):
        s = _corner_row(s, ca_ptr, cb_ptr, qb, kb, r, W, N, FORM)
    return s


@triton.jit
def _corner_row(s, ca_ptr, cb_ptr, qb, kb, r, W, N, FORM: tl.constexpr):
    """Add the terms of the pairs whose corner lies in image row ``r`` of the block that holds the corners (see
    :func:`_logits`): the column segment per token of that block, the row segment per pair."""
    ca_q, cb_q, i_q, j_q, first_q, mask_m, _ = qb
    ca_k, cb_k, k_r, l_c, first_k, mask_n, _ = kb
    if FORM == 'h2v':
        row = first_k + r
        at = row * W + j_q
        va = tl.load(ca_ptr + at, mask=mask_m & (at < N), other=0.0)
        column = -tl.abs(tl.load(cb_ptr + at, mask=mask_m & (at < N), other=0.0) - cb_q)
        s = tl.where((k_r == row)[None, :], s + column[:, None] - tl.abs(ca_k[None, :] - va[:, None]), s)
    else:
        row = first_q + r
        at = row * W + l_c
        va = tl.load(ca_ptr + at, mask=mask_n & (at < N), other=0.0)
        column = -tl.abs(tl.load(cb_ptr + at, mask=mask_n & (at < N), other=0.0) - cb_k)
        s = tl.where((i_q == row)[:, None], s + column[None, :] - tl.abs(ca_q[:, None] - va[None, :]), s)
    return s


@triton.jit
def _slices(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, bh, N, D, DV):
    """Pointers to slice ``bh`` (batch * head) of q, k (N, D), v (N, DV) and the tables (N)."""
    return (q_ptr + slice_offset(bh, N, D), k_ptr + slice_offset(bh, N, D), v_ptr + slice_offset(bh, N, DV),
            ca_ptr + slice_offset(bh, N, 1), cb_ptr + slice_offset(bh, N, 1))


@triton.jit
def _block(ca_ptr, cb_ptr, start, BLOCK: tl.constexpr, N, W):
    """The block of BLOCK consecutive tokens from ``start``: (Ca, Cb entries, image rows, columns, first image
    row, mask, offsets)."""
    offs, mask, _ = token_block(start, BLOCK, N, 0, 1)
    ca = tl.load(ca_ptr + offs, mask=mask, other=0.0)
    cb = tl.load(cb_ptr + offs, mask=mask, other=0.0)
    return ca, cb, offs // W, offs % W, start // W, mask, offs


@triton.jit
def _whole_fwd(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, o_ptr, lse_ptr, scale2, N, D, DV, W: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               PRECISION: tl.constexpr):
    """The V2H path's online softmax for one query tile: BLOCK_M columns of one image row i of a map W tokens
    wide (the H2V path runs it on the transposed map), over all key blocks of consecutive tokens.

    Log2 units: the tables (Ca, Cb) and the scale ``scale2`` come times log2(e), the softmax takes ``exp2``. The
    log-decays are <= 0 (the ops' contract), so the tables are monotone along their lines and a segment's sum is
    minus the absolute difference of its ends: M[p, s] = -|Ca[i, j] - Ca[i, l]| - |Cb[i, l] - Cb[k, l]| for
    query p = (i, j) and key s = (k, l). The query tile holds one row, so the corner entries Ca[i, l], Cb[i, l]
    are per-key vectors, gathered from row i by the key's column (W a constexpr: no division by a run-time
    width), and the second term is a per-key vector: per score the bias costs one difference and one absolute
    value. Keys past N read Cb as +inf: a bias of -inf, no per-score mask. The key loop holds no loop of its
    own and is software-pipelined. Grid: one axis of (slice, image row, column chunk) programs, slice-major."""
    chunks: tl.constexpr = (W + BLOCK_M - 1) // BLOCK_M
    tiles = (N // W) * chunks
    bh = tl.program_id(0) // tiles
    row = tl.program_id(0) % tiles // chunks
    cols = tl.program_id(0) % chunks * BLOCK_M + tl.arange(0, BLOCK_M)
    q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr = _slices(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, bh, N, D, DV)
    mask_m = cols < W
    offs_m = row * W + cols
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_tile(q_ptr, offs_m, mask_m, offs_d, D)
    ca_q = tl.load(ca_ptr + offs_m, mask=mask_m, other=0.0)
    m = tl.full([BLOCK_M], float('-inf'), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start_n in range(0, N, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        corner = row * W + offs_n % W  # (query row, key column): in the map for every key, past N too
        ca_corner = tl.load(ca_ptr + corner)
        per_key = -tl.abs(tl.load(cb_ptr + corner) - tl.load(cb_ptr + offs_n, mask=mask_n, other=float('inf')))
        s = tl.dot(q, tl.trans(load_tile(k_ptr, offs_n, mask_n, offs_d, D)), input_precision=PRECISION)
        x = s * scale2 + per_key[None, :] - tl.abs(ca_q[:, None] - ca_corner[None, :])
        m, total, acc = online_softmax_step(x, load_tile(v_ptr, offs_n, mask_n, offs_dv, DV), m, total, acc,
                                             PRECISION)
    store_tile(o_ptr + slice_offset(bh, N, DV), offs_m, mask_m, offs_dv, DV, acc / total[:, None])
    tl.store(lse_ptr + slice_offset(bh, N, 1) + offs_m, (m + tl.math.log2(total)) * _LN2, mask=mask_m)


@triton.jit
def _per_query(ptr, own, other, QUERIES_OWN: tl.constexpr, BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr):
    """A per-query vector (lse, delta) broadcast over a tile of (own x other tokens): the queries are the rows
    (QUERIES_OWN, the dq program) or the columns (the dk, dv program: the tile is transposed)."""
    if QUERIES_OWN:
        x = tl.load(ptr + own[6], mask=own[5], other=0.0)[:, None]
    else:
        x = tl.load(ptr + other[6], mask=other[5], other=0.0)[None, :]
    return tl.broadcast_to(x, (BLOCK_OWN, BLOCK_OTHER))


@triton.jit
def _probs(s, own, other, ca_ptr, cb_ptr, W, N, CORNERS: tl.constexpr, ROWS_OWN: tl.constexpr,
           ROWS_OTHER: tl.constexpr):
    """One path's recomputed probabilities P on a tile whose rows are the program's own block ``own`` and columns
    the tokens of ``other`` (see :func:`_block`, :func:`_tile`), from the scores minus the log-normaliser ``s``,
    in log2 units. CORNERS: the own tokens hold the corners (M's V2H form, own rows at the corners); otherwise the
    H2V form, the other tile's rows at the corners. Other tokens past the map get P = 0 through their tables
    (+inf); own tokens past it compute finite rows that are never stored."""
    if CORNERS:
        x = _logits(s, ca_ptr, cb_ptr, own, other, W, N, 'v2h', ROWS_OWN)
    else:
        x = _logits(s, ca_ptr, cb_ptr, own, other, W, N, 'h2v', ROWS_OTHER)
    return tl.math.exp2(x)


@triton.jit
def _corner_rows(ds, onehot, own, other, corner_a, corner_b, PRECISION: tl.constexpr):
    """Add one tile's share of the corner gradients of M[r, c] = sgn(j_r >= l_c) (Ca[i_r, j_r] - Ca[i_r, l_c]) +
    sgn(i_r >= k_c) (Cb[i_r, l_c] - Cb[k_c, l_c]) at Ca[i_r, l_c], Cb[i_r, l_c] (own row x other column), summed
    over the block's own tokens of each image row, to ``corner_a`` and ``corner_b`` (other tokens x CORNER_ROWS):
    ``onehot`` (own tokens x CORNER_ROWS) selects the rows, and a matrix product does the sum on the tensor cores,
    the other tokens on its rows (so that the result is split over the warps, not replicated). Returns them and
    the own entries' Ca gradient sum_c sgn(j_r >= l_c) ds."""
    signed = tl.where(own[3][:, None] >= other[3][None, :], -ds, ds)
    corner_a = tl.dot(tl.trans(signed.to(onehot.dtype)), onehot, corner_a, input_precision=PRECISION)
    signed_b = tl.where(own[2][:, None] >= other[2][None, :], ds, -ds).to(onehot.dtype)
    corner_b = tl.dot(tl.trans(signed_b), onehot, corner_b, input_precision=PRECISION)
    return corner_a, corner_b, -tl.sum(signed, 1)


@triton.jit
def _store_corners(corner_a_ptr, corner_b_ptr, part_a, part_b, own, pid, c0, N, W, SLOTS, BLOCK: tl.constexpr,
                   BLOCK_OTHER: tl.constexpr, COLS: tl.constexpr):
    """Store a column chunk's corner gradients (see :func:`_corner_rows`), summed over its other tiles, into the
    (H, SLOTS, W) corner buffers: folded over the other-tile rows, and per own image row into slot
    ``pid - first_block(row)``. Each (row, slot, column) has exactly one writer: no atomics, and the host's sum
    over slots is deterministic."""
    corner_rows: tl.constexpr = part_a.shape[1]
    rows = (own[4] + tl.arange(0, corner_rows))[None, :]
    cols = (c0 + tl.arange(0, COLS))[:, None]
    at = (rows * SLOTS + pid - (rows * W) // BLOCK) * W + cols
    keep = (rows * W < tl.minimum((pid + 1) * BLOCK, N)) & (cols < W)
    tl.store(corner_a_ptr + at, tl.sum(tl.reshape(part_a, (BLOCK_OTHER // COLS, COLS, corner_rows)), 0), mask=keep)
    tl.store(corner_b_ptr + at, tl.sum(tl.reshape(part_b, (BLOCK_OTHER // COLS, COLS, corner_rows)), 0), mask=keep)


@triton.jit
def _tile(ca_ptr, cb_ptr, r0, c0, H, W, BLOCK: tl.constexpr, COLS: tl.constexpr):
    """A 2D tile of tokens: image rows r0.. (BLOCK // COLS of them) x columns c0..c0+COLS, as :func:`_block`;
    the tables read +inf past the map (see :func:`_probs`)."""
    rows = r0 + tl.arange(0, BLOCK) // COLS
    cols = c0 + tl.arange(0, BLOCK) % COLS
    mask = (rows < H) & (cols < W)
    offs = rows * W + cols
    ca = tl.load(ca_ptr + offs, mask=mask, other=float('inf'))
    cb = tl.load(cb_ptr + offs, mask=mask, other=float('inf'))
    return ca, cb, rows, cols, r0, mask, offs


@triton.jit
def _whole_bwd(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, self_ptr,
               corner_a_ptr, corner_b_ptr, scale, scale2, weight, N, H, W, D, DV, SLOTS, KEYS: tl.constexpr,
               FORM: tl.constexpr, GRADS: tl.constexpr, CORNER_SUMS: tl.constexpr, BLOCK_OWN: tl.constexpr,
               BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, COLS: tl.constexpr,
               ROWS_OWN: tl.constexpr, CORNER_ROWS: tl.constexpr, PRECISION: tl.constexpr):
    """One program per block of BLOCK_OWN keys (KEYS) or queries, one path (``FORM``) per launch. CORNERS ('v2h'
    for queries, 'h2v' for keys): the own tokens hold the path's corners. Tiles are (own x other tokens): for keys
    H2V's M[s, p] is then V2H's form with the key in the query's place.

    GRADS: g1 = dk, g2 = dv (KEYS) or g1 = dq. CORNER_SUMS (with CORNERS): the corners Ca, Cb at (own row, other
    column), summed over the block's tokens of each image row, into the corner slots. A launch does one or both.
    The table gradient at the own tokens' own entries goes to ``self_ptr``: Ca's with CORNER_SUMS, Cb's (not
    CORNERS) with GRADS.

    The other tokens come in tiles of (BLOCK_OTHER // COLS image rows x COLS columns), column chunk by column
    chunk. ROWS_OWN: the image rows a block can touch; CORNER_ROWS: those padded to a power of two, at least 16
    (a matrix product's smallest side)."""
    CORNERS: tl.constexpr = (FORM == 'h2v') == KEYS
    blocks = tl.cdiv(N, BLOCK_OWN)
    pid = tl.program_id(0) % blocks  # the own block; grid: one axis of (slice, block) programs, slice-major
    bh = tl.program_id(0) // blocks
    q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr = _slices(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, bh, N, D, DV)
    do_ptr += slice_offset(bh, N, DV)
    lse_ptr += slice_offset(bh, N, 1)
    delta_ptr += slice_offset(bh, N, 1)
    own = _block(ca_ptr, cb_ptr, pid * BLOCK_OWN, BLOCK_OWN, N, W)
    offs, mask = own[6], own[5]
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    a, da, b_ptr, db_ptr = bwd_operands(q_ptr, k_ptr, v_ptr, do_ptr, offs, mask, offs_d, D, offs_dv, DV, KEYS)
    g1 = tl.zeros([BLOCK_OWN, BLOCK_D], tl.float32)
    g2 = tl.zeros([BLOCK_OWN, BLOCK_DV], tl.float32)
    self_own = tl.zeros([BLOCK_OWN], tl.float32)
    corner_a_ptr += slice_offset(bh, H * SLOTS, W)
    corner_b_ptr += slice_offset(bh, H * SLOTS, W)
    for c0 in range(0, W, COLS):
        if CORNER_SUMS:  # the column chunk's corner sums, over its other tiles
            corner_a = tl.zeros([BLOCK_OTHER, CORNER_ROWS], tl.float32)
            corner_b = tl.zeros([BLOCK_OTHER, CORNER_ROWS], tl.float32)
        for r0 in range(0, H, BLOCK_OTHER // COLS):
            other = _tile(ca_ptr, cb_ptr, r0, c0, H, W, BLOCK_OTHER, COLS)
            b = load_tile(b_ptr, other[6], other[5], offs_d, D)
            db = load_tile(db_ptr, other[6], other[5], offs_dv, DV)
            # the per-query log-normaliser and delta enter as the products' initial values (fewer registers)
            lse = _per_query(lse_ptr, own, other, not KEYS, BLOCK_OWN, BLOCK_OTHER)
            s = tl.dot(a, tl.trans(b), -lse / scale2, input_precision=PRECISION) * scale2
            p = _probs(s, own, other, ca_ptr, cb_ptr, W, N, CORNERS, ROWS_OWN, BLOCK_OTHER // COLS)
            if KEYS and GRADS:
                g2 += tl.dot((weight * p).to(db.dtype), db, input_precision=PRECISION)
            delta = _per_query(delta_ptr, own, other, not KEYS, BLOCK_OWN, BLOCK_OTHER)
            ds = weight * p * tl.dot(da, tl.trans(db), -delta / weight, input_precision=PRECISION)  # P (w dP - delta)
            if CORNER_SUMS:
                # own image row r of the block: column r of the one-hot (own tokens x CORNER_ROWS) row selector
                # (built per tile: r0 < H, always true, keeps it from being hoisted to hold registers throughout)
                onehot = tl.where((own[2][:, None] == own[4] + tl.arange(0, CORNER_ROWS)[None, :]) & (r0 < H), 1.0,
                                  0.0)
                corner_a, corner_b, self_part = _corner_rows(ds, onehot.to(b.dtype), own, other, corner_a, corner_b,
                                                             PRECISION)
                self_own += self_part  # at Ca[i_r, j_r]
            if GRADS:
                if not CORNERS:  # at Cb[i_r, j_r]
                    self_own -= tl.sum(tl.where(other[2][None, :] >= own[2][:, None], ds, -ds), 1)
                g1 += tl.dot(ds.to(b.dtype), b, input_precision=PRECISION)
        if CORNER_SUMS:
            _store_corners(corner_a_ptr, corner_b_ptr, corner_a, corner_b, own, pid, c0, N, W, SLOTS, BLOCK_OWN,
                           BLOCK_OTHER, COLS)
    if GRADS:
        store_tile(g1_ptr + slice_offset(bh, N, D), offs, mask, offs_d, D, g1 * scale)
        if KEYS:
            store_tile(g2_ptr + slice_offset(bh, N, DV), offs, mask, offs_dv, DV, g2)
    if CORNER_SUMS or not CORNERS:
        tl.store(self_ptr + slice_offset(bh, N, 1) + offs, self_own, mask=mask)


def _rows_touched(block: int, h: int, w: int) -> int:
    """Image rows a block of ``block`` consecutive tokens can touch."""
    return min(h, (block - 1) // w + 2)


def query_block(width: int, block_m: int) -> int:
    """The query tile's columns on a map ``width`` tokens wide: of 16 up to ``block_m``, the one that pads a row
    least (the larger on ties); the tile holds one image row."""
    return min((block for block in (16, 32, 64, 128) if block <= max(16, block_m)),
               key=lambda block: (triton.cdiv(width, block) * block, -block))


def _map(x: torch.Tensor, path: str, hh: int, ww: int) -> torch.Tensor:
    """Per-token tensor ``x`` (BH, N, ...) in the order of the map the forward runs ``path`` on: the image's
    ('v2h'), its transpose's ('h2v': V2H of the transposed map is the H2V path of the image)."""
    if path == 'v2h':
        return x
    return x.reshape(x.shape[0], hh, ww, -1).transpose(1, 2).reshape(x.shape).contiguous()


def forward_launches(q, k, v, ca, cb, scale: float, form: str, cap: int):
    """The forward's launches, one per path of ``form`` (each V2H on its map, :func:`_map`), and their outputs
    (o: (paths, BH, N, dv), lse: (paths, BH, N), float32; in :func:`mmppma.ops.forms.paths` order, each in its
    map's token order: :func:`image_order` puts them in the image's)."""
    bh, n, d = q.shape
    dv = v.shape[-1]
    hh, ww = ca.shape[-2:]
    names = paths(form)
    o = torch.empty(len(names), bh, n, dv, device=q.device, dtype=torch.float32)
    lse = torch.empty(len(names), bh, n, device=q.device, dtype=torch.float32)
    cfg = lp.config('whole_fwd', n, q.dtype, cap)
    tables = (ca.reshape(bh, n, 1) * LOG2E, cb.reshape(bh, n, 1) * LOG2E)
    launches = []
    for i, path in enumerate(names):
        width = ww if path == 'v2h' else hh
        # the transposed map's row tables are the image's column tables
        ca2, cb2 = (_map(t, path, hh, ww) for t in (tables if path == 'v2h' else tables[::-1]))
        block_m = query_block(width, cfg.block_m)
        launches.append(lp.Launch(_whole_fwd, (triton.cdiv(width, block_m) * (n // width) * bh, ),
                                  (*(_map(x, path, hh, ww) for x in (q, k, v)), ca2, cb2, o[i], lse[i],
                                   float(scale) * LOG2E, n, d, dv),
                                  dict(W=width, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_D=lp.pow2(d),
                                       BLOCK_DV=lp.pow2(dv), PRECISION=lp.precision(q.dtype)), cfg))
    return launches, o, lse


def image_order(o: torch.Tensor, lse: torch.Tensor, form: str, hh: int, ww: int):
    """:func:`forward_launches`' outputs in the image's token order."""
    if 'h2v' not in paths(form):
        return o, lse
    # the transposed map is ww rows of hh tokens
    return tuple(torch.stack([_map(x, path, ww, hh) for x, path in zip(xs, paths(form))]) for xs in (o, lse))


def backward_launches(q, k, v, ca, cb, o, lse, dout, scale: float, form: str, cap: int):
    """The backward's launches, one pair (keys, queries) per path, and the buffers they fill: dq, dk, dv per path
    (paths, BH, N, .) float32, and the table-gradient parts (each token's own entries ``self_q``, ``self_k``:
    (2, BH, N); corner slots ``corner_k``, ``corner_q``: (2, BH, H, SLOTS, W); index 0 is Ca, 1 is Cb)."""
    bh, n, d = q.shape
    dv = v.shape[-1]
    hh, ww = ca.shape[-2:]
    names = paths(form)
    weight = 1.0 / len(names)
    # delta_p = rowsum(dP_p * P_p) = weight * (dout . o_p)
    delta = (weight * (dout.float().unsqueeze(0) * o).sum(-1)).contiguous()
    zeros = dict(device=q.device, dtype=torch.float32)
    dq = torch.empty(len(names), *q.shape, **zeros)
    dk = torch.empty(len(names), *k.shape, **zeros)
    dvv = torch.empty(len(names), *v.shape, **zeros)
    self_q, self_k = torch.zeros(2, bh, n, **zeros), torch.zeros(2, bh, n, **zeros)
    # the corners are the 'v2h' path's for the queries, the 'h2v' path's for the keys: (own, other) block per role
    blocks = {}
    for keys, corners in ((True, False), (True, True), (False, False), (False, True)):
        cfg = lp.config(('whole_bwd_kv' if keys else 'whole_bwd_q') + ('_corners' if corners else ''), n, q.dtype,
                        cap, ww)
        blocks[keys, corners] = cfg, (cfg.block_n, cfg.block_m) if keys else (cfg.block_m, cfg.block_n)
    slots = {keys: (ww - 1) // blocks[keys, True][1][0] + 2 for keys in (True, False)}  # blocks a row can touch
    corner = {keys: torch.zeros(2, bh, hh, slots[keys], ww, **zeros) for keys in (True, False)}
    ca2, cb2, lse2 = ca * LOG2E, cb * LOG2E, lse * LOG2E  # log2 units, as the forward
    launches = []
    for i, path in enumerate(names):
        for keys, grads, selfs in ((True, (dk[i], dvv[i]), self_k), (False, (dq[i], dq[i]), self_q)):
            corners = (path == 'h2v') == keys
            cfg, (own, other) = blocks[keys, corners]
            rows = _rows_touched(own, hh, ww)
            # (GRADS, CORNER_SUMS) of each launch: the corner sums in the same program or in one of their own
            parts = [(True, False), (False, True)] if corners and cfg.corner_pass else [(True, corners)]
            launches.extend(lp.Launch(
                _whole_bwd, (triton.cdiv(n, own) * bh, ),
                (q, k, v, ca2, cb2, dout, lse2[i], delta[i], *grads, selfs[0 if corners else 1], corner[keys][0],
                 corner[keys][1], float(scale), float(scale) * LOG2E, weight, n, hh, ww, d, dv, slots[keys]),
                dict(KEYS=keys, FORM=path, GRADS=with_grads, CORNER_SUMS=sums, BLOCK_OWN=own,
                     BLOCK_OTHER=other, BLOCK_D=lp.pow2(d), BLOCK_DV=lp.pow2(dv), COLS=min(other, lp.pow2(ww, 1)),
                     ROWS_OWN=rows, CORNER_ROWS=lp.pow2(rows), PRECISION=lp.precision(q.dtype)), cfg)
                for with_grads, sums in parts)
    return launches, (dq, dk, dvv, self_q, self_k, corner[True], corner[False])


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ca: torch.Tensor, cb: torch.Tensor, scale: float,
             form: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flattened per (batch*head): q, k (BH, N, d), v (BH, N, dv), Ca, Cb (BH, H, W) float32 cumsum tables ->
    the output (BH, N, dv) in v's dtype, and per path o (paths, BH, N, dv) and lse (paths, BH, N), float32."""
    launches, o, lse = forward_launches(q, k, v, ca, cb, scale, form, lp.capability(q.device))
    lp.run(launches)
    o, lse = image_order(o, lse, form, *ca.shape[-2:])
    return o.mean(0).to(v.dtype), o, lse  # equal weights: 1 path -> itself, 2 paths -> the release's average


def _forward_shapes(q, k, v, ca, cb, scale, form):
    count = len(paths(form))
    out = v.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    return out, out.new_empty(count, *out.shape, dtype=torch.float32), q.new_empty(count, *q.shape[:2],
                                                                                   dtype=torch.float32)


def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ca: torch.Tensor,
              cb: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, scale: float,
              form: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv in the inputs' dtypes and dCa, dCb (float32) from the output gradient ``dout``."""
    bh, hh, ww = ca.shape
    launches, (dq, dk, dvv, self_q, self_k, corner_k, corner_q) = backward_launches(
        q, k, v, ca, cb, o, lse, dout.contiguous(), scale, form, lp.capability(q.device))
    lp.run(launches)
    dca, dcb = ((self_q[i] + self_k[i]).reshape(bh, hh, ww) + corner_q[i].sum(2) + corner_k[i].sum(2)
                for i in range(2))  # Ca, Cb
    return dq.sum(0).to(q.dtype), dk.sum(0).to(k.dtype), dvv.sum(0).to(v.dtype), dca, dcb


def _backward_shapes(dout, q, k, v, ca, cb, o, lse, scale, form):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(ca),
            torch.empty_like(cb))


whole_attention_op = lp.library_op('whole_attention_triton', _forward, _forward_shapes)
whole_attention_backward_op = lp.library_op('whole_attention_triton_backward', _backward, _backward_shapes)


def _save(ctx, inputs, output):
    q, k, v, ca, cb, scale, form = inputs
    ctx.save_for_backward(q, k, v, ca, cb, *output[1:])
    ctx.mark_non_differentiable(*output[1:])  # o and lse: saved for the backward
    ctx.args = (scale, form)


def _gradients(ctx, dout, do, dlse):
    return (*whole_attention_backward_op(dout, *ctx.saved_tensors, *ctx.args), None, None)


whole_attention_op.register_autograd(_gradients, setup_context=_save)


def whole_attention_triton(q, k, v, ca, cb, scale: float, form: str):
    """Whole attention of ``form`` ('release' | 'v2h' | 'h2v'). q, k: (B, heads, H, W, d); v: (B, heads, H, W,
    dv); ca, cb: (B, heads, H, W) float32 decay tables. An image narrower than ``lp.NARROW`` tokens and at least
    that tall runs transposed, so that a block of consecutive tokens spans few image rows: the transpose's rows
    are the columns here, its Ca is Cb and its 'v2h' path 'h2v'."""
    b, heads, hh, ww, d = q.shape
    if ww < lp.NARROW <= hh:
        def t(x):
            return x.transpose(2, 3)
        return t(whole_attention_triton(t(q), t(k), t(v), t(cb), t(ca), scale, transposed(form)))
    bh = b * heads
    if abs(scale) < 1e-30:  # scores of zero; the backward divides the log-normaliser by the scale
        q, scale = q * 0, 1.0
    out, _, _ = whole_attention_op(
        q.reshape(bh, hh * ww, d).contiguous(), k.reshape(bh, hh * ww, d).contiguous(),
        v.reshape(bh, hh * ww, v.shape[-1]).contiguous(), ca.reshape(bh, hh, ww).float().contiguous(),
        cb.reshape(bh, hh, ww).float().contiguous(), float(scale), form)
    return out.reshape(b, heads, hh, ww, v.shape[-1])
