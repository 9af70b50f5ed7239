"""Whole attention, Triton kernels: the softmax forms of PPMVA (and RMT's Manhattan attention), forward and
backward, no N x N tensor.

Scores ``S = scale * q k^T`` per tile plus the path's bias (``'v2h'``: M, ``'h2v'``: M^T), built in registers
from the O(N) cumsum tables Ca (rows) and Cb (columns), under an online softmax. A bias reads each table at a
token's own entry and at a "corner" (the query's row and the key's column for V2H, the reverse for H2V).

The forward runs every path of the form in one launch, each as V2H (H2V is V2H on the transposed map, with the two
tables swapped: the kernel reads the same tensors with the row and column strides swapped) on query tiles of
consecutive map tokens, whose corner entries are gathered once per key column chunk (see :func:`_fwd_map`). q, k
and v are read by strides in the caller's layout; o and lse are written in the image's order. In half precision on
large maps a launch before it writes each path's column table in three bfloat16 parts per token, which the key
tiles' products add to the scores (:func:`_whole_fwd_parts`).

The backward has one kernel form too (:func:`_bwd_map`): own tiles of consecutive map tokens, the corners in the own
tokens' rows. The queries' programs run on the path's forward map; the keys' programs on its transpose, where the
same path puts the corner in the key's row (V2H's corner, the query's row and the key's column, is the transpose's
row of the key). One launch holds the queries' programs of every path, another the keys' (or one launch both, where
the two roles take the same tiles: :func:`_whole_bwd`). Each program recomputes its tiles and reduces the bias
gradient onto the tables from one (own token x column) sum of the score gradient per column chunk, a tensor-core
product with a column spreader: the own tokens' row-table entries and (queries' programs) the corner entries,
stored into the program's own slot of one (slots, 2, BH, H, W) buffer in the image's order. The host sums the
slots once: no atomics, deterministic, extra memory O(N) per slot.

Token p = i*W + j. V2H: M[p, s] = Sa(i_p; j_p, l_s) + Sb(l_s; i_p, k_s); H2V: M[s, p].
"""
import dataclasses
import functools
import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..caches import register_cache
from ..forms import paths, transposed
from ..masks import head_decay_tables, on_tables
from ..triton_support import launch as lp
from ..triton_support.calls import Caller, call_kernels
from ..triton_support.tiles import (
    add_normalisers,
    head_offset,
    load_rows,
    normalisers,
    online_softmax_start,
    slice_offset,
    store_tile,
    table_parts,
)

LOG2E = 1.4426950408889634
_LN2 = tl.constexpr(0.6931471805599453)  # the kernels' (a plain global is not a constant to triton)
LOG2E_ = tl.constexpr(LOG2E)


@triton.jit
def _on_slice(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, bh, heads, N, q_b, q_n, v_b, v_n):
    """q, k, v (strides (q_b, q_n, ...), v's (v_b, v_n, ...)) and the contiguous tables moved to slice ``bh``."""
    q_off = head_offset(bh, heads, q_b, q_n)
    return (q_ptr + q_off, k_ptr + q_off, v_ptr + head_offset(bh, heads, v_b, v_n), ca_ptr + slice_offset(bh, N, 1),
            cb_ptr + slice_offset(bh, N, 1))


@triton.constexpr_function
def tile_rows_spanned(width, block):
    """The most rows of a map ``width`` tokens wide that a tile of ``block`` consecutive tokens (starting at a
    multiple of ``block``) touches."""
    return (width - math.gcd(width, block) + block - 1) // width + 1


@triton.constexpr_function
def full_key_tiles(height, cols, block):
    """Whether tiles of ``block`` other tokens over ``cols`` columns (``block // cols`` map rows) fill every place
    and a map ``height`` rows tall holds a whole number of them: no key tile has a row past the map or an empty
    place (the forward's FULL tiles)."""
    rows = block // cols
    return rows * cols == block and height % rows == 0


@triton.constexpr_function
def shifted_key_tiles(height, width, cols, block_n, block_m):
    """Whether the forward's key tiles of ``block_n // cols`` map rows over ``cols`` columns, not full
    (:func:`full_key_tiles`), start one row below the first map row of each query tile of ``block_m`` consecutive
    tokens of a map ``width`` tokens wide (they span two rows at most): the key rows before that row lie on or above
    every query row, the others on or below, so that no key tile lies between them. The first and last key tiles
    may reach past the map (masked per key)."""
    return not full_key_tiles(height, cols, block_n) and tile_rows_spanned(width, block_m) <= 2


@triton.constexpr_function
def between_loop(width, key_rows, block):
    """Whether the forward's full key tiles of ``key_rows`` map rows against query tiles of ``block`` consecutive
    tokens of a map ``width`` tokens wide have key rows between a query tile's rows (run in a loop of their own):
    tiles of several rows, or query tiles over more than two rows."""
    return key_rows > 1 or tile_rows_spanned(width, block) > 2


@triton.jit
def _whole_fwd_parts(ca_ptr, cb_ptr, parts_ptr, inv_scale, BH, HH: tl.constexpr, WW: tl.constexpr,
                     V2H: tl.constexpr, BLOCK: tl.constexpr):
    """Each path's column table over the scale, T2 / scale, as three bfloat16 parts per token whose sum is it
    (to float32's precision), in the path's map order: parts (paths, BH, N, 16), columns 0-2 the parts, the others
    zero. Axis 0: blocks of BLOCK map tokens; axis 1: the slice; axis 2: the path (V2H: the image and its column
    table Cb; H2V: the transpose, HH tokens wide, and Ca)."""
    N: tl.constexpr = HH * WW
    tok = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bh = tl.program_id(1)
    path = tl.program_id(2)
    mask = tok < N
    if V2H and path == 0:
        t = tl.load(cb_ptr + slice_offset(bh, N, 1) + tok, mask=mask, other=0.0)
    else:  # the transpose's token (r, c) is the image's (c, r)
        t = tl.load(ca_ptr + slice_offset(bh, N, 1) + (tok % HH) * WW + tok // HH, mask=mask, other=0.0)
    store_tile(parts_ptr + slice_offset(path * BH + bh, N, 16), tok, mask, tl.arange(0, 16), 16,
               table_parts(t * inv_scale, 0))


@triton.jit
def _fwd_keys(q, m, sums, acc, bias, t2_corner, k_ptr, v_ptr, t2_ptr, parts_ptr, scale, r_from, r_to, key_c, in_row,
              tile_rows, D, DV, q_r, q_c, v_r, v_c, t_r, t_c, H: tl.constexpr, W: tl.constexpr, ROWS: tl.constexpr,
              EVEN: tl.constexpr, SIDE: tl.constexpr, FOLD: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, STAGES: tl.constexpr = None,
              SHIFTED: tl.constexpr = False, IN_PRODUCT: tl.constexpr = False):
    """:func:`_fwd_map`'s online softmax over the key tiles of map rows ``r_from`` to ``r_to`` (multiples of ROWS)
    of one column chunk: the running (m, sums, acc) after them. SIDE: the keys lie on or above every query row (-1:
    the bias is ``bias - T2[key]``), on or below them (1: ``bias + T2[key]``) or between (0: ``bias - |T2[corner] -
    T2[key]|``), ``bias`` the chunk's (query x column) tile for that side. Keys past the map read T2 as -inf below
    the query rows, +inf elsewhere: a bias of -inf. FOLD (SIDE -1 or 1): the product adds SIDE * T2[key] / scale,
    read as three bfloat16 parts per key from ``parts_ptr`` (:func:`_whole_fwd_parts`, in the map's order), by a
    product of a (query x 16) column of SIDE with the (key x 16) parts: no T2 per key on the CUDA cores. STAGES:
    the loop's software-pipelining stages (None: the launch's). SHIFTED: ``r_from`` may be negative and ``r_to``
    past the map (:func:`shifted_key_tiles`), the rows off the map masked. IN_PRODUCT: ``bias`` is in units of
    1 / scale and the scores' product starts from it (an accumulator operand apart from the result: no addition
    per score); with FOLD the logits stay in those units, ``scale`` applied in the softmax's exponent."""
    TAKE_T2: tl.constexpr = not (FOLD and SIDE != 0)
    if not TAKE_T2:  # SIDE in every column (the parts' three, zeros after them): keys off the map read -SIDE * inf
        side = tl.full((q.shape[0], 16), SIDE * 1.0, tl.float32).to(tl.bfloat16)
    for r0 in tl.range(r_from, r_to, ROWS, num_stages=STAGES):
        key_r = r0 + tile_rows
        if EVEN:
            mask_n = tl.full(in_row.shape, True, tl.int1)
        elif SHIFTED:
            mask_n = (key_r.to(tl.uint32) < H) & in_row
        else:
            mask_n = in_row if H % ROWS == 0 else (key_r < H) & in_row
        if TAKE_T2:
            at = key_r * t_r + key_c * t_c
            if EVEN:
                t2_key = tl.load(t2_ptr + at)
            else:
                t2_key = tl.load(t2_ptr + at, mask=mask_n, other=float('-inf') if SIDE > 0 else float('inf'))
            k = load_rows(k_ptr, key_r * q_r + key_c * q_c, mask_n, tl.arange(0, BLOCK_D), D)
            if IN_PRODUCT:
                s = tl.dot(q, tl.trans(k), bias, input_precision=PRECISION)
            else:
                s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        else:  # (keys past the map's columns and empty places take a bias of -inf from the tile, keys past its
            # rows the parts -SIDE * inf)
            parts = tl.load(parts_ptr + ((key_r * W + key_c) * 16)[:, None] + tl.arange(0, 16)[None, :],
                            mask=mask_n[:, None], other=float('-inf') if SIDE > 0 else float('inf'))
            k = load_rows(k_ptr, key_r * q_r + key_c * q_c, mask_n, tl.arange(0, BLOCK_D), D)
            if IN_PRODUCT:
                s = tl.dot(q, tl.trans(k), tl.dot(side, tl.trans(parts), bias), input_precision=PRECISION)
            else:
                s = tl.dot(q, tl.trans(k), tl.dot(side, tl.trans(parts)), input_precision=PRECISION)
        if IN_PRODUCT:  # (the bias in s)
            if not TAKE_T2:  # the logits s * scale: the row maximum of s, scale in the exponent's product
                m_new = tl.maximum(m, tl.max(s, 1) * scale)
            elif SIDE < 0:
                x = s * scale - t2_key[None, :]
            elif SIDE > 0:
                x = s * scale + t2_key[None, :]
            else:
                x = s * scale - tl.abs(t2_corner - t2_key[None, :])
        elif not TAKE_T2:
            x = s * scale + bias
        elif SIDE < 0:
            x = s * scale + bias - t2_key[None, :]
        elif SIDE > 0:
            x = s * scale + bias + t2_key[None, :]
        else:
            x = s * scale + (bias - tl.abs(t2_corner - t2_key[None, :]))
        if IN_PRODUCT and not TAKE_T2:
            p = tl.math.exp2(s * (scale * LOG2E_) - (m_new * LOG2E_)[:, None])
        else:
            m_new = tl.maximum(m, tl.max(x, 1))
            p = tl.math.exp2(x * LOG2E_ - (m_new * LOG2E_)[:, None])
        alpha = tl.math.exp2((m - m_new) * LOG2E_)
        v = load_rows(v_ptr, key_r * v_r + key_c * v_c, mask_n, tl.arange(0, BLOCK_DV), DV)
        p = p.to(v.dtype)
        sums = add_normalisers(sums, p, alpha, PRECISION)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    return m, sums, acc


@triton.jit
def _fwd_map(q_ptr, k_ptr, v_ptr, t1_ptr, t2_ptr, parts_ptr, o_ptr, lse_ptr, scale, pid, D, DV, q_r, q_c, v_r, v_c,
             t_r, t_c, o_r, o_c, H: tl.constexpr, W: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             COLS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, SCORES_LAYOUT: tl.constexpr,
             FOLD: tl.constexpr, PRECISION: tl.constexpr, IN_PRODUCT: tl.constexpr):
    """The V2H path's online softmax for tile ``pid`` of one slice on an H x W map: BLOCK_M consecutive map tokens
    (in row-major order: a tile spans map rows, so only the map's last tile pads), over all keys in tiles of
    (BLOCK_N // COLS map rows x COLS columns; any COLS, the places past them empty), column chunk by column chunk
    (masked only where the map is not a whole number of tiles).
    The map is the image (V2H) or its transpose (H2V: V2H of the transposed map); its token (r, c) lies at
    ``r * q_r + c * q_c`` in q and k (``v_r``, ``v_c`` in v, ``t_r``, ``t_c`` in the tables T1 (along the map's
    rows) and T2 (along its columns), ``o_r``, ``o_c`` in o and lse, which are in the image's order).

    The log-decays are <= 0 (the ops' contract), so the tables are monotone along their lines and a segment's sum
    is minus the absolute difference of its ends: M[p, s] = -|T1[i, j] - T1[i, l]| - |T2[i, l] - T2[k, l]| for
    query p = (i, j) and key s = (k, l). The corner (i, l) takes the query's row and the key's column, so within a
    column chunk both corner entries are fixed per (query, key column): they are gathered once per chunk as tiles,
    with the row segment's term. Per score the bias then costs one difference and one addition (of the absolute
    value); on full key tiles, and on the others where query tiles span two map rows at most (SHIFTED: the key
    tiles then start one row below the query tile's first, :func:`shifted_key_tiles`), the column segment's sign is
    known for the key rows on or above every query row of the tile (T2[k, l] - T2[i, l]) and on or below them
    (T2[i, l] - T2[k, l]), so there (FULL) the bias is one tile plus or minus T2[key]: one addition per score
    (:func:`_fwd_keys`), or (FOLD) none, T2[key] added by the scores' product from its parts. The logits stay in
    natural units: the softmax's ``exp2`` takes them times log2(e) in the product that subtracts the row maximum.
    Keys past the map read T2 as +inf (-inf below the query rows): a bias of -inf, no per-score mask. The softmax's
    denominators are a product of P with ones on the tensor cores, not a sum per score. The key loops (over the
    chunk's rows) hold no loop of their own and are software-pipelined (but the few key tiles between the query
    rows')."""
    ROWS: tl.constexpr = BLOCK_N // COLS
    EVEN: tl.constexpr = H % ROWS == 0 and W % COLS == 0 and ROWS * COLS == BLOCK_N
    # (EVEN: no key row past the map, no empty place, no column past it)
    SHIFTED: tl.constexpr = SCORES_LAYOUT and shifted_key_tiles(H, W, COLS, BLOCK_N, BLOCK_M)
    FULL: tl.constexpr = SCORES_LAYOUT and (full_key_tiles(H, COLS, BLOCK_N) or SHIFTED)
    tok = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = tok < H * W
    row = tok // W
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_rows(q_ptr, row * q_r + (tok % W) * q_c, mask_m, offs_d, D)
    tok_m = row * o_r + (tok % W) * o_c
    # one offset where the tables and the outputs share strides (a second, equal one costs registers: the in-place
    # H2V path spills at 255 with it)
    tok_t = tok_m if t_r == o_r and t_c == o_c else row * t_r + (tok % W) * t_c
    t1_q = tl.load(t1_ptr + tok_t, mask=mask_m, other=0.0)
    m, sums, acc = online_softmax_start(BLOCK_M, BLOCK_DV, PRECISION)
    tile_rows = tl.arange(0, BLOCK_N) // COLS
    # key tiles [r_start, above) lie on or above every query row (their rows <= the query tile's first), [below,
    # r_end) on or below (>= its last), [above, below) between (none where tiles are one row and query tiles span two
    # rows at most, or the tiles start one row below the query tile's first: SHIFTED)
    MEET: tl.constexpr = between_loop(W, ROWS, BLOCK_M) and not SHIFTED
    if SHIFTED:
        above = pid * BLOCK_M // W + 1
        below = above
        r_start = above - tl.cdiv(above, ROWS) * ROWS  # (rows before the map: masked)
        r_end = above + tl.cdiv(H - above, ROWS) * ROWS
        in_first = row < above  # the query tile's first row (its others: the next)
    else:
        above = (pid * BLOCK_M // W + 1) // ROWS * ROWS
        below = tl.maximum(tl.cdiv((tl.minimum(pid * BLOCK_M + BLOCK_M, H * W) - 1) // W, ROWS) * ROWS, above)
        r_start = 0
        r_end = H
    for c0 in range(0, W, COLS):
        key_c = c0 + tl.arange(0, BLOCK_N) % COLS
        in_row = key_c < W
        if ROWS * COLS < BLOCK_N:  # a tile's places past its ROWS x COLS keys stay empty
            in_row &= tl.arange(0, BLOCK_N) < ROWS * COLS
        if SHIFTED:  # the corners: the query tile's two rows' entries, per key column
            first = (above - 1) * t_r + key_c * t_c
            second = tl.minimum(above, H - 1) * t_r + key_c * t_c
            t2_corner = tl.where(in_first[:, None], tl.load(t2_ptr + first, mask=in_row, other=0.0)[None, :],
                                 tl.load(t2_ptr + second, mask=in_row, other=0.0)[None, :])
            row_bias = -tl.abs(t1_q[:, None] - tl.where(in_first[:, None],
                                                         tl.load(t1_ptr + first, mask=in_row, other=0.0)[None, :],
                                                         tl.load(t1_ptr + second, mask=in_row, other=0.0)[None, :]))
        else:
            corner = row[:, None] * t_r + key_c[None, :] * t_c  # (query row, key column)
            on_map = mask_m[:, None] & in_row[None, :]
            t2_corner = tl.load(t2_ptr + corner, mask=on_map, other=0.0)
            row_bias = -tl.abs(t1_q[:, None] - tl.load(t1_ptr + corner, mask=on_map, other=0.0))
        if FULL:
            # the chunk's tiles in the scores' layout (that of a product: a zero one added), so that no tile changes
            # layout per key tile; the column segment's sign known for the key rows above and below the query
            # tile's: there the bias is one tile and T2[key] (-inf past the row; per-key masks only for SHIFTED tiles'
            # rows off the map)
            zero = tl.dot(q, tl.trans(tl.zeros([BLOCK_N, BLOCK_D], q.dtype)), input_precision=PRECISION)
            t2_corner += zero
            bias = tl.where(in_row[None, :], row_bias + t2_corner, float('-inf'))  # above: T2[key] - T2[corner]
            if IN_PRODUCT:  # (the bias in units of 1 / scale: the products start from it)
                inv_scale = 1.0 / scale
                bias *= inv_scale
            m, sums, acc = _fwd_keys(q, m, sums, acc, bias, t2_corner, k_ptr, v_ptr, t2_ptr, parts_ptr, scale,
                                     r_start, above, key_c, in_row, tile_rows, D, DV, q_r, q_c, v_r, v_c, t_r, t_c, H,
                                     W, ROWS, EVEN and not SHIFTED, -1, FOLD, BLOCK_D, BLOCK_DV, PRECISION, None,
                                     SHIFTED, IN_PRODUCT)
            # (the corner entries read again after it: not held through the loop above)
            if SHIFTED:
                t2_corner = tl.where(in_first[:, None], tl.load(t2_ptr + first, mask=in_row, other=0.0)[None, :],
                                     tl.load(t2_ptr + second, mask=in_row, other=0.0)[None, :]) + zero
            else:
                t2_corner = tl.load(t2_ptr + corner, mask=on_map, other=0.0) + zero
            if MEET:
                bias -= t2_corner * inv_scale if IN_PRODUCT else t2_corner
                m, sums, acc = _fwd_keys(q, m, sums, acc, bias, t2_corner, k_ptr, v_ptr, t2_ptr, parts_ptr, scale,
                                         above, below, key_c, in_row, tile_rows, D, DV, q_r, q_c, v_r, v_c, t_r, t_c,
                                         H, W, ROWS, EVEN, 0, False, BLOCK_D, BLOCK_DV, PRECISION, 1, False,
                                         IN_PRODUCT)
                bias -= t2_corner * inv_scale if IN_PRODUCT else t2_corner  # below: T2[corner] - T2[key]
            else:
                bias -= 2 * (t2_corner * inv_scale if IN_PRODUCT else t2_corner)
            m, sums, acc = _fwd_keys(q, m, sums, acc, bias, t2_corner, k_ptr, v_ptr, t2_ptr, parts_ptr, scale,
                                     below, r_end, key_c, in_row, tile_rows, D, DV, q_r, q_c, v_r, v_c, t_r, t_c, H, W,
                                     ROWS, EVEN and not SHIFTED, 1, FOLD, BLOCK_D, BLOCK_DV, PRECISION, None, SHIFTED,
                                     IN_PRODUCT)
        else:  # (tiles with empty places or key rows past the map against query tiles over three rows or more keep
            # the masks' layout: a loop between the query rows costs registers there, and the paths spill)
            m, sums, acc = _fwd_keys(q, m, sums, acc, row_bias, t2_corner, k_ptr, v_ptr, t2_ptr, parts_ptr, scale,
                                     0, H, key_c, in_row, tile_rows, D, DV, q_r, q_c, v_r, v_c, t_r, t_c, H, W, ROWS,
                                     EVEN, 0, False, BLOCK_D, BLOCK_DV, PRECISION)
    total = normalisers(sums)
    store_tile(o_ptr, tok_m, mask_m, offs_dv, DV, acc / total[:, None])
    tl.store(lse_ptr + tok_m, m + tl.math.log2(total) * _LN2, mask=mask_m)


@triton.jit
def _whole_fwd(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, ct1_ptr, ct2_ptr, parts_ptr, o_ptr, lse_ptr, scale, heads, N, D,
               DV, q_b, q_n, q_h, q_w, v_b, v_n, v_h, v_w, TILES, BH, HH: tl.constexpr, WW: tl.constexpr,
               V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_M: tl.constexpr, COLS_V: tl.constexpr,
               COLS_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               TABLES_T: tl.constexpr, SCORES_LAYOUT: tl.constexpr, FOLD_V: tl.constexpr, FOLD_H: tl.constexpr,
               PRECISION: tl.constexpr, IN_PRODUCT: tl.constexpr = False):
    """Whole attention's forward, every path of the form in one launch: axis 1 is the path (V2H, then H2V), axis 0
    the (slice, tile) programs, slice-major, TILES per slice (tiles of BLOCK_M consecutive tokens of the path's
    map). q, k (B, heads, H, W, d) with strides (q_b, q_n, q_h, q_w, 1), v likewise; the tables (BH, H, W), o
    (paths, BH, H, W, dv) and lse (paths, BH, H, W) contiguous, in the image's order. The V2H path
    runs :func:`_fwd_map` on the image (map width WW, key column chunks of COLS_V), the H2V path on its transpose
    (map width HH, COLS_H), its tables the image's column and row tables, read in place or (TABLES_T) from ct1 and
    ct2 (BH, W, H), their transposed copies: in place a map row's entries lie apart, and triton 3.6 copies them one
    by one. SCORES_LAYOUT: whether full key tiles hold a column chunk's tiles in the scores' layout (:func:`_fwd_map`;
    under triton 3.7 and later). FOLD_V, FOLD_H: whether the path's products add its column table on those tiles,
    from ``parts`` (paths, BH, N, 16) bfloat16 (:func:`_whole_fwd_parts`). IN_PRODUCT: whether those tiles' products
    start from the bias tile (:func:`_fwd_keys`; :func:`bias_in_product`)."""
    bh = tl.program_id(0) // TILES
    tile = tl.program_id(0) % TILES
    path = tl.program_id(1)
    q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr = _on_slice(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, bh, heads, N, q_b, q_n, v_b,
                                                    v_n)
    o_ptr += slice_offset(path * BH + bh, N, DV)
    lse_ptr += slice_offset(path * BH + bh, N, 1)
    parts_ptr += slice_offset(path * BH + bh, N, 16)
    if V2H:
        if path == 0:
            _fwd_map(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, parts_ptr, o_ptr, lse_ptr, scale, tile, D, DV, q_h, q_w, v_h,
                     v_w, WW, 1, WW, 1, HH, WW, BLOCK_M, BLOCK_N, COLS_V, BLOCK_D, BLOCK_DV, SCORES_LAYOUT, FOLD_V,
                     PRECISION, IN_PRODUCT)
    h2v_index: tl.constexpr = 1 if V2H else 0
    if H2V:
        if path == h2v_index:
            if TABLES_T:
                ct1_ptr += slice_offset(bh, N, 1)
                ct2_ptr += slice_offset(bh, N, 1)
                _fwd_map(q_ptr, k_ptr, v_ptr, ct1_ptr, ct2_ptr, parts_ptr, o_ptr, lse_ptr, scale, tile, D, DV, q_w,
                         q_h, v_w, v_h, HH, 1, 1, WW, WW, HH, BLOCK_M, BLOCK_N, COLS_H, BLOCK_D, BLOCK_DV,
                         SCORES_LAYOUT, FOLD_H, PRECISION, IN_PRODUCT)
            else:
                _fwd_map(q_ptr, k_ptr, v_ptr, cb_ptr, ca_ptr, parts_ptr, o_ptr, lse_ptr, scale, tile, D, DV, q_w, q_h,
                         v_w, v_h, 1, WW, 1, WW, WW, HH, BLOCK_M, BLOCK_N, COLS_H, BLOCK_D, BLOCK_DV, SCORES_LAYOUT,
                         FOLD_H, PRECISION, IN_PRODUCT)


@triton.constexpr_function
def corner_slots(width, own):
    """The most own tiles of ``own`` consecutive tokens that touch one row of a map ``width`` tokens wide: the
    backward's corner slots per path (the kernel and the host's buffer both take them from here)."""
    return (width + own - 2) // own + 1


@triton.constexpr_function
def spread_columns(cols):
    """The backward's column spreader's width for column chunks of ``cols``: a power of two, 16 at least (a
    tensor-core product's)."""
    return max(16, 1 << (cols - 1).bit_length())


@triton.jit
def _chunk_terms(t1_ptr, t2_ptr, row_own, mask_own, cols, in_row, t_r, t_c, t1_own, lse_own, KEYS: tl.constexpr):
    """:func:`_bwd_map`'s (own token x column) terms of one column chunk, log2 units: the corner entries of the
    column table, and the row segment's term (the queries': minus their log-normaliser too)."""
    corner = row_own[:, None] * t_r + cols[None, :] * t_c  # (own row, other column)
    on_map = mask_own[:, None] & in_row[None, :]
    t2_corner = tl.load(t2_ptr + corner, mask=on_map, other=0.0) * LOG2E_
    chunk_bias = -tl.abs(t1_own[:, None] - tl.load(t1_ptr + corner, mask=on_map, other=0.0) * LOG2E_)
    if not KEYS:
        chunk_bias -= lse_own[:, None]
    return t2_corner, chunk_bias


@triton.jit
def _bwd_others(a, da, g1, g2, per_column, above, chunk_bias, t2_corner, delta_own, row_own, first_row, spread,
                tile_rows, cols, in_row, b_ptr, db_ptr, t2_ptr, lse_ptr, delta_ptr, b_r, b_c, db_r, db_c, t_r, t_c,
                scale2, weight, offs_d, offs_dv, D, DV, r_from, r_to, H: tl.constexpr, KEYS: tl.constexpr,
                ROWS: tl.constexpr, SPAN_ROWS: tl.constexpr, SIDE: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`_bwd_map`'s loop over the other tiles of map rows ``r_from`` to ``r_to`` (multiples of ROWS) of one
    column chunk: the running (g1, g2, per_column, above) after them. The queries' tiles above their own rows
    (SIDE -1: the bias is ``chunk_bias - T2[other]``) or below them (1: ``chunk_bias + T2[other]``), or (0) those
    that hold an own row, which also sum the other rows above each own row, per column, over that row's own tokens,
    into ``above``'s row ``own row - first_row`` (the corners' column segment); the keys' every tile (0, no
    corners). SIDE 0: the bias is ``chunk_bias - |T2[corner] - T2[other]|``."""
    # the queries' tiles' pointers moved ROWS rows per tile (their bounds vary per program: offsets from the row
    # would be recomputed per token and tile); the keys' loop runs from 0 to H (constants: the compiler moves them)
    CARRY: tl.constexpr = not KEYS
    if CARRY:
        rows = r_from + tile_rows
        t2_at = t2_ptr + rows * t_r + cols * t_c
        b_at = b_ptr + (rows * b_r + cols * b_c)[:, None] + offs_d[None, :]
        db_at = db_ptr + (rows * db_r + cols * db_c)[:, None] + offs_dv[None, :]
    for r0 in range(r_from, r_to, ROWS):
        if not CARRY:
            rows = r0 + tile_rows
            at = rows * t_r + cols * t_c
            t2_at = t2_ptr + at
            lse_at = lse_ptr + at
            delta_at = delta_ptr + at
            b_at = b_ptr + (rows * b_r + cols * b_c)[:, None] + offs_d[None, :]
            db_at = db_ptr + (rows * db_r + cols * db_c)[:, None] + offs_dv[None, :]
        mask = (rows < H) & in_row
        # the other tokens' column table (past the map: a bias of -inf, T2 = -inf below the own rows, else +inf)
        t2_other = tl.load(t2_at, mask=mask, other=float('-inf') if SIDE > 0 else float('inf')) * LOG2E_
        b = tl.load(b_at, mask=mask[:, None] & (offs_d[None, :] < D), other=0.0)
        db = tl.load(db_at, mask=mask[:, None] & (offs_dv[None, :] < DV), other=0.0)
        s = tl.dot(a, tl.trans(b), input_precision=PRECISION)
        if KEYS:  # the other queries' log-normaliser
            lse_other = tl.load(lse_at, mask=mask, other=0.0) * LOG2E_
            x = s * scale2 + (chunk_bias - (tl.abs(t2_corner - t2_other[None, :]) + lse_other[None, :]))
            delta = tl.load(delta_at, mask=mask, other=0.0)[None, :] * weight
        else:
            if SIDE < 0:
                x = s * scale2 + (chunk_bias - t2_other[None, :])
            elif SIDE > 0:
                x = s * scale2 + (chunk_bias + t2_other[None, :])
            else:
                x = s * scale2 + (chunk_bias - tl.abs(t2_corner - t2_other[None, :]))
            delta = delta_own[:, None]
        p = tl.math.exp2(x)
        if KEYS:
            g2 += tl.dot(p.to(db.dtype), db, input_precision=PRECISION)
        ds = (p * (tl.dot(da, tl.trans(db), input_precision=PRECISION) - delta)).to(b.dtype)  # P (w dP - delta)
        if not KEYS and SIDE == 0:  # the corners' column segment: own row r0 + j takes the sum so far
            for j in tl.static_range(ROWS):
                if j == 0:
                    so_far = per_column
                else:  # and the tile's rows before j
                    so_far = tl.dot(ds, tl.where(tile_rows[:, None] < j, spread, 0.0).to(b.dtype), per_column,
                                    input_precision=PRECISION)
                row_sum = tl.sum(tl.where((row_own == r0 + j)[:, None], so_far, 0.0), 0)
                above = tl.where((tl.arange(0, SPAN_ROWS) == r0 + j - first_row)[:, None], row_sum[None, :], above)
        per_column = tl.dot(ds, spread.to(b.dtype), per_column, input_precision=PRECISION)
        g1 += tl.dot(ds, b, input_precision=PRECISION)
        if CARRY:
            rows += ROWS
            t2_at += ROWS * t_r
            b_at += ROWS * b_r
            db_at += ROWS * db_r
    return g1, g2, per_column, above


@triton.jit
def _bwd_map(q_ptr, k_ptr, v_ptr, t1_ptr, t2_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, self_ptr, c1_ptr,
             c2_ptr, scale, scale2, weight, pid, D, DV, x_r, x_c, v_r, v_c, o_r, o_c, t_r, t_c, slot_stride,
             H: tl.constexpr, W: tl.constexpr, KEYS: tl.constexpr, BLOCK_OWN: tl.constexpr,
             BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, COLS: tl.constexpr,
             PRECISION: tl.constexpr):
    """Own tile ``pid`` of one slice on an H x W map: BLOCK_OWN consecutive map tokens (row-major: a tile spans map
    rows, only the map's last tile pads), keys (KEYS) or queries, against every other token, in tiles of
    (BLOCK_OTHER // COLS map rows x COLS columns), column chunk by column chunk. The map is the one on which the
    path puts the corner at (own row, other column) - for queries the forward's map, for keys its transpose (see
    the module's doc). Map token (r, c) lies at ``r * x_r + c * x_c`` in q and k (``v_r``, ``v_c`` in v, ``o_r``,
    ``o_c`` in the output gradient, ``t_r``, ``t_c`` in the tables, lse, delta and every gradient buffer, which are
    in the image's order).

    Log2 units, as the forward: x = scale2 s - lse2 + m, with the log-mask m = -|T1[own] - T1[c]| - |T2[c] -
    T2[other]| at the corner c, T1 the map's row table and T2 its column table (scaled as loaded). The corner
    entries and the row segment's term are (own token x column) tiles gathered once per column chunk; per score
    the bias costs one difference and one absolute value, and (keys) the queries' log-normaliser.

    g1 = dk, g2 = dv (KEYS) or g1 = dq (float32, image order), and ``self_ptr``: T1's gradient at the own tokens.
    The queries' programs also store T1's and T2's gradients at the corners (the own rows, every column), summed
    over the own tokens of a row and the other rows, at ``c1_ptr`` / ``c2_ptr`` plus the slot ``pid % SLOTS``
    (``slot_stride`` apart; the tiles that touch one map row are at most SLOTS consecutive ones): one writer per
    entry, no atomics. Both come from the score gradient summed per (own token, column of the chunk) over the
    chunk's tiles, by products with a (other tokens x COLS) column spreader, and the signs applied once per chunk
    (the column segment's, which depends on the own and the other row, per score). Signs follow the segment sums'
    index order (exact at ties): the row segment runs from the own column j to the other column l, the column
    segment from the own row i to the other row k."""
    SLOTS: tl.constexpr = corner_slots(W, BLOCK_OWN)
    SPAN: tl.constexpr = (BLOCK_OWN + W - 2) // W + 1  # map rows one own tile touches, at most
    SPAN_ROWS: tl.constexpr = max(2, 1 << (SPAN - 1).bit_length())  # (a power of two)
    ROWS: tl.constexpr = BLOCK_OTHER // COLS
    SPREAD: tl.constexpr = spread_columns(COLS)
    tok = pid * BLOCK_OWN + tl.arange(0, BLOCK_OWN)
    mask_own = tok < H * W
    row_own = tok // W
    col_own = tok % W
    tok_own = row_own * t_r + col_own * t_c
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if KEYS:
        a = load_rows(k_ptr, row_own * x_r + col_own * x_c, mask_own, offs_d, D)
        da = load_rows(v_ptr, row_own * v_r + col_own * v_c, mask_own, offs_dv, DV)
        b_ptr, db_ptr, b_r, b_c, db_r, db_c = q_ptr, do_ptr, x_r, x_c, o_r, o_c
    else:
        a = load_rows(q_ptr, row_own * x_r + col_own * x_c, mask_own, offs_d, D)
        da = load_rows(do_ptr, row_own * o_r + col_own * o_c, mask_own, offs_dv, DV)
        b_ptr, db_ptr, b_r, b_c, db_r, db_c = k_ptr, v_ptr, x_r, x_c, v_r, v_c
    da = (da.to(tl.float32) * weight).to(da.dtype)  # the path's weight (1 or 1/2: exact) in dP once, not per score
    # own tokens past the map: P = 0
    t1_own = tl.load(t1_ptr + tok_own, mask=mask_own, other=float('inf')) * LOG2E_
    g1 = tl.zeros([BLOCK_OWN, BLOCK_D], tl.float32)
    g2 = tl.zeros([BLOCK_OWN, BLOCK_DV], tl.float32)
    self_own = tl.zeros([BLOCK_OWN], tl.float32)
    # other token -> its column of the chunk (of SPREAD; those past COLS take none): the score gradient summed per
    # (own token, column) by a product
    spread = tl.where((tl.arange(0, BLOCK_OTHER) % COLS)[:, None] == tl.arange(0, SPREAD)[None, :], 1.0, 0.0)
    tile_rows = tl.arange(0, BLOCK_OTHER) // COLS
    if not KEYS:  # the own queries' log-normaliser, log2 units (past the map: any finite value, P = 0 there)
        lse_own = tl.load(lse_ptr + tok_own, mask=mask_own, other=0.0) * LOG2E_
        delta_own = tl.load(delta_ptr + tok_own, mask=mask_own, other=0.0) * weight
        first_row = pid * BLOCK_OWN // W  # of the own tile; its corner sums go to slot pid % SLOTS
        last_row = (tl.minimum(pid * BLOCK_OWN + BLOCK_OWN, H * W) - 1) // W
        own_from = first_row // ROWS * ROWS  # the other tiles that hold an own row
        own_to = last_row // ROWS * ROWS + ROWS
        slot = (pid % SLOTS) * slot_stride
    else:
        lse_own = 0.0  # (the keys take the other queries')
    for c0 in range(0, W, COLS):
        per_column = tl.zeros([BLOCK_OWN, SPREAD], tl.float32)  # sum over the chunk's rows of ds, per column
        if not KEYS:  # per own row of the tile: the same over the other rows above it, summed over its own tokens
            above = tl.zeros([SPAN_ROWS, SPREAD], tl.float32)
        cols = c0 + tl.arange(0, BLOCK_OTHER) % COLS
        in_row = cols < W
        t2_corner, chunk_bias = _chunk_terms(t1_ptr, t2_ptr, row_own, mask_own, cols, in_row, t_r, t_c, t1_own,
                                             lse_own, KEYS)
        if KEYS:
            g1, g2, per_column, _ = _bwd_others(
                a, da, g1, g2, per_column, 0.0, chunk_bias, t2_corner, 0.0, row_own, 0, spread, tile_rows, cols,
                in_row, b_ptr, db_ptr, t2_ptr, lse_ptr, delta_ptr, b_r, b_c, db_r, db_c, t_r, t_c, scale2, weight,
                offs_d, offs_dv, D, DV, 0, H, H, KEYS, ROWS, SPAN_ROWS, 0, PRECISION)
        else:  # the tiles above the own rows, those that hold one (the corner sums), those below: above and below the
            # column segment's sign is known (T2 is monotone along a column), the bias one tile
            g1, g2, per_column, above = _bwd_others(
                a, da, g1, g2, per_column, above, chunk_bias + t2_corner, t2_corner, delta_own, row_own, first_row,
                spread, tile_rows, cols, in_row, b_ptr, db_ptr, t2_ptr, lse_ptr, delta_ptr, b_r, b_c, db_r, db_c, t_r,
                t_c, scale2, weight, offs_d, offs_dv, D, DV, 0, own_from, H, KEYS, ROWS, SPAN_ROWS, -1, PRECISION)
            # (the chunk's terms gathered again: not held through the loop above)
            t2_corner, chunk_bias = _chunk_terms(t1_ptr, t2_ptr, row_own, mask_own, cols, in_row, t_r, t_c,
                                                 t1_own, lse_own, KEYS)
            g1, g2, per_column, above = _bwd_others(
                a, da, g1, g2, per_column, above, chunk_bias, t2_corner, delta_own, row_own, first_row, spread,
                tile_rows, cols, in_row, b_ptr, db_ptr, t2_ptr, lse_ptr, delta_ptr, b_r, b_c, db_r, db_c, t_r, t_c,
                scale2, weight, offs_d, offs_dv, D, DV, own_from, own_to, H, KEYS, ROWS, SPAN_ROWS, 0, PRECISION)
            g1, g2, per_column, above = _bwd_others(
                a, da, g1, g2, per_column, above, chunk_bias - t2_corner, t2_corner, delta_own, row_own, first_row,
                spread, tile_rows, cols, in_row, b_ptr, db_ptr, t2_ptr, lse_ptr, delta_ptr, b_r, b_c, db_r, db_c, t_r,
                t_c, scale2, weight, offs_d, offs_dv, D, DV, own_to, H, H, KEYS, ROWS, SPAN_ROWS, 1, PRECISION)
        # the row segment's sign, own column j against the chunk's column l: d m / d T1[own] = -d m / d T1[c]
        signed = per_column * tl.where(col_own[:, None] >= c0 + tl.arange(0, SPREAD)[None, :], 1.0, -1.0)
        self_own += tl.sum(signed, 1)
        if not KEYS:  # the corners, per own row, into the program's slot
            keep = (c0 + tl.arange(0, SPREAD) < W) & (tl.arange(0, SPREAD) < COLS)
            for r in tl.static_range(SPAN):
                here = (row_own == first_row + r)[:, None]
                at = (first_row + r) * t_r + (c0 + tl.arange(0, SPREAD)) * t_c + slot
                # only the rows the tile touches: the slot's entry of a row past them is another tile's
                keep_row = keep & (first_row + r <= last_row)
                tl.store(c1_ptr + at, -tl.sum(tl.where(here, signed, 0.0), 0), mask=keep_row)
                # + above the own row, - at and below it
                above_row = tl.sum(tl.where((tl.arange(0, SPAN_ROWS) == r)[:, None], above, 0.0), 0)
                tl.store(c2_ptr + at, 2 * above_row - tl.sum(tl.where(here, per_column, 0.0), 0), mask=keep_row)
    store_tile(g1_ptr, tok_own, mask_own, offs_d, D, g1 * scale)
    if KEYS:
        store_tile(g2_ptr, tok_own, mask_own, offs_dv, DV, g2 * weight)
    tl.store(self_ptr + tok_own, self_own, mask=mask_own)


@triton.jit
def _whole_bwd(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, gt_ptr, scale,
               scale2, weight, heads, N, D, DV, q_b, q_n, q_h, q_w, v_b, v_n, v_h, v_w, o_b, o_n, o_h, o_w, TILES, BH,
               SLOT_V, SLOT_H, HH: tl.constexpr, WW: tl.constexpr, KEYS: tl.constexpr, BOTH: tl.constexpr,
               V2H: tl.constexpr, H2V: tl.constexpr, BLOCK_OWN: tl.constexpr, COLS_V: tl.constexpr,
               COLS_H: tl.constexpr, BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
               PRECISION: tl.constexpr):
    """Whole attention's backward: the queries' programs (or, KEYS, the keys'; or, BOTH, the queries' and then the
    keys') of every path of the form in one launch. Axis 1 is the path (V2H, then H2V; BOTH: the queries' paths,
    then the keys'), axis 0 the (slice, own tile) programs, slice-major, TILES per slice (own tiles of BLOCK_OWN
    consecutive tokens of the path's map). A path's queries run on its forward map, its keys on the transpose:
    :func:`_bwd_map` on the image (map width WW, column chunks of COLS_V; row table Ca) or on its transpose (HH,
    COLS_H; row table Cb). q, k, v and the output gradient are read by strides ((B, heads, H, W, .) with strides
    (x_b, x_n, x_h, x_w, 1)); the tables (BH, H, W), lse and delta (paths, BH, H, W) are contiguous. Every buffer
    written is float32 in the image's order: dq, dk, dv (paths, BH, H, W, .) and the table gradients ``gt`` (slots,
    2, BH, H, W), Ca's plane then Cb's per slot: slot 0 (queries) or 1 (keys) the own tokens' row-table gradient,
    slots ``2 + SLOT_V + s`` (V2H) and ``2 + SLOT_H + s`` (H2V) the queries' corner sums (see :func:`_bwd_map`):
    the two roles write apart, so one launch may hold both."""
    PATHS: tl.constexpr = V2H + H2V
    if BOTH:
        if tl.program_id(1) < PATHS:
            _bwd_role(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, gt_ptr,
                      scale, scale2, weight, heads, N, D, DV, q_b, q_n, q_h, q_w, v_b, v_n, v_h, v_w, o_b, o_n, o_h,
                      o_w, TILES, BH, SLOT_V, SLOT_H, tl.program_id(1), HH, WW, False, V2H, H2V, BLOCK_OWN, COLS_V,
                      COLS_H, BLOCK_OTHER, BLOCK_D, BLOCK_DV, PRECISION)
        else:
            _bwd_role(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, gt_ptr,
                      scale, scale2, weight, heads, N, D, DV, q_b, q_n, q_h, q_w, v_b, v_n, v_h, v_w, o_b, o_n, o_h,
                      o_w, TILES, BH, SLOT_V, SLOT_H, tl.program_id(1) - PATHS, HH, WW, True, V2H, H2V, BLOCK_OWN,
                      COLS_V, COLS_H, BLOCK_OTHER, BLOCK_D, BLOCK_DV, PRECISION)
    else:
        _bwd_role(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, gt_ptr,
                  scale, scale2, weight, heads, N, D, DV, q_b, q_n, q_h, q_w, v_b, v_n, v_h, v_w, o_b, o_n, o_h, o_w,
                  TILES, BH, SLOT_V, SLOT_H, tl.program_id(1), HH, WW, KEYS, V2H, H2V, BLOCK_OWN, COLS_V, COLS_H,
                  BLOCK_OTHER, BLOCK_D, BLOCK_DV, PRECISION)


@triton.jit
def _bwd_role(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, gt_ptr, scale,
              scale2, weight, heads, N, D, DV, q_b, q_n, q_h, q_w, v_b, v_n, v_h, v_w, o_b, o_n, o_h, o_w, TILES, BH,
              SLOT_V, SLOT_H, path, HH: tl.constexpr, WW: tl.constexpr, KEYS: tl.constexpr, V2H: tl.constexpr,
              H2V: tl.constexpr, BLOCK_OWN: tl.constexpr, COLS_V: tl.constexpr, COLS_H: tl.constexpr,
              BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`_whole_bwd`'s program of one role (KEYS: keys, else queries) on path index ``path`` of the launch."""
    bh = tl.program_id(0) // TILES
    tile = tl.program_id(0) % TILES
    q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr = _on_slice(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, bh, heads, N, q_b, q_n, v_b,
                                                    v_n)
    do_ptr += head_offset(bh, heads, o_b, o_n)
    lse_ptr += slice_offset(path * BH + bh, N, 1)
    delta_ptr += slice_offset(path * BH + bh, N, 1)
    if KEYS:  # g1 = dk, g2 = dv; the queries' g1 = dq (no g2)
        g1_ptr = dk_ptr + slice_offset(path * BH + bh, N, D)
        g2_ptr = dv_ptr + slice_offset(path * BH + bh, N, DV)
    else:
        g1_ptr = dq_ptr + slice_offset(path * BH + bh, N, D)
        g2_ptr = g1_ptr
    plane = slice_offset(BH, N, 1)  # one table's gradient, every slice
    ga_ptr = gt_ptr + (2 * KEYS) * plane + slice_offset(bh, N, 1)  # slot 0 or 1: Ca's plane
    gb_ptr = ga_ptr + plane
    corners = gt_ptr + 4 * plane + slice_offset(bh, N, 1)  # Ca's plane of slot 2
    h2v_index: tl.constexpr = 1 if V2H else 0
    # a path's queries run on its forward map, its keys on the transpose
    if V2H:
        if path == 0:
            if KEYS:
                _bwd_transpose(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, ga_ptr,
                               gb_ptr, corners + SLOT_V * 2 * plane, plane, scale, scale2, weight, tile, D, DV, q_h,
                               q_w, v_h, v_w, o_h, o_w, HH, WW, KEYS, BLOCK_OWN, BLOCK_OTHER, BLOCK_D, BLOCK_DV, COLS_H,
                               PRECISION)
            else:
                _bwd_image(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, ga_ptr,
                           gb_ptr, corners + SLOT_V * 2 * plane, plane, scale, scale2, weight, tile, D, DV, q_h, q_w,
                           v_h, v_w, o_h, o_w, HH, WW, KEYS, BLOCK_OWN, BLOCK_OTHER, BLOCK_D, BLOCK_DV, COLS_V,
                           PRECISION)
    if H2V:
        if path == h2v_index:
            if KEYS:
                _bwd_image(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, ga_ptr,
                           gb_ptr, corners + SLOT_H * 2 * plane, plane, scale, scale2, weight, tile, D, DV, q_h, q_w,
                           v_h, v_w, o_h, o_w, HH, WW, KEYS, BLOCK_OWN, BLOCK_OTHER, BLOCK_D, BLOCK_DV, COLS_V,
                           PRECISION)
            else:
                _bwd_transpose(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, ga_ptr,
                               gb_ptr, corners + SLOT_H * 2 * plane, plane, scale, scale2, weight, tile, D, DV, q_h,
                               q_w, v_h, v_w, o_h, o_w, HH, WW, KEYS, BLOCK_OWN, BLOCK_OTHER, BLOCK_D, BLOCK_DV, COLS_H,
                               PRECISION)


@triton.jit
def _bwd_image(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, ga_ptr, gb_ptr,
               at_ptr, plane, scale, scale2, weight, tile, D, DV, q_h, q_w, v_h, v_w, o_h, o_w, H: tl.constexpr,
               W: tl.constexpr, KEYS: tl.constexpr, BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, COLS: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`_bwd_map` on the image (H x W): rows along H, row table Ca."""
    _bwd_map(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, ga_ptr, at_ptr,
             at_ptr + plane, scale, scale2, weight, tile, D, DV, q_h, q_w, v_h, v_w, o_h, o_w, W, 1, 2 * plane, H, W,
             KEYS, BLOCK_OWN, BLOCK_OTHER, BLOCK_D, BLOCK_DV, COLS, PRECISION)


@triton.jit
def _bwd_transpose(q_ptr, k_ptr, v_ptr, ca_ptr, cb_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, ga_ptr, gb_ptr,
                   at_ptr, plane, scale, scale2, weight, tile, D, DV, q_h, q_w, v_h, v_w, o_h, o_w,
                   H: tl.constexpr, W: tl.constexpr, KEYS: tl.constexpr, BLOCK_OWN: tl.constexpr,
                   BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, COLS: tl.constexpr,
                   PRECISION: tl.constexpr):
    """:func:`_bwd_map` on the transpose of an H x W image: its rows are the image's columns, its row table Cb,
    its column table Ca."""
    _bwd_map(q_ptr, k_ptr, v_ptr, cb_ptr, ca_ptr, do_ptr, lse_ptr, delta_ptr, g1_ptr, g2_ptr, gb_ptr, at_ptr + plane,
             at_ptr, scale, scale2, weight, tile, D, DV, q_w, q_h, v_w, v_h, o_w, o_h, 1, W, 2 * plane, W, H, KEYS,
             BLOCK_OWN, BLOCK_OTHER, BLOCK_D, BLOCK_DV, COLS, PRECISION)


def query_block(width: int, block_m: int, least: int = 16) -> int:
    """The own tile's tokens on a line of ``width`` tokens (the kernels' own tiles: consecutive tokens of the map):
    of ``least`` up to ``block_m``, the one that pads the line least (the larger on ties)."""
    return min((block for block in (16, 32, 64, 128) if least <= block <= max(least, block_m)),
               key=lambda block: (triton.cdiv(width, block) * block, -block))


def key_columns(width: int, height: int, block_n: int, least: int = 8, most: int = 128, pow2: bool = True) -> int:
    """The columns of a tile of ``block_n`` other tokens (``block_n // columns`` map rows) on a map ``width`` x
    ``height``: of ``least`` up to ``block_n`` and ``most`` (powers of two, or with ``pow2`` False any count: a
    tile then leaves ``block_n % columns`` places empty), the one whose tiles compute the fewest scores (on ties a
    power of two, then the wider: fewer column chunks)."""
    counts = range(least, min(block_n, most) + 1)
    return min((cols for cols in counts if not pow2 or cols & (cols - 1) == 0),
               key=lambda cols: (lp.cdiv(width, cols) * lp.cdiv(height, block_n // cols), cols & (cols - 1) != 0,
                                 -cols))


#: the least map tokens at which a half-precision forward's FULL key tiles take the column table in their products
#: (:func:`_fwd_keys`' FOLD): there the parts' launch (:func:`_whole_fwd_parts`) costs less than the additions it saves
FOLD_TOKENS = 4096


def bias_in_product(cap: int) -> bool:
    """Whether the forward's full key tiles' products start from the bias on this capability (or the interpreter's
    0; :func:`_fwd_keys`' IN_PRODUCT): the tensor-core products of sm_80, sm_86, sm_89 and sm_120 take their
    accumulator apart from their result, so that saves an addition per score; sm_90's and sm_100's accumulate in
    place, where the bias would be copied per score."""
    return cap < 90 or cap >= 120


def _fwd_plan(q, v, hh: int, ww: int, form: str, cap: int, positive: bool = True):
    """(grid, constexprs, config, tiles per slice) of the forward's launch, cached per call site (shapes, strides
    and dtypes, capability, form, whether the scale is positive)."""
    key = (q.shape, v.shape[-1], q.dtype, cap, form, lp.precision(q.dtype), FOLD_TOKENS, positive)
    plan = _FWD_PLANS.get(key)
    if plan is None:
        bh, n, d, dv = q.shape[0] * q.shape[1], hh * ww, q.shape[-1], v.shape[-1]
        cfg = lp.config('whole_fwd', n, q.dtype, cap)
        names = paths(form)
        # query tiles of consecutive map tokens (they span map rows): the block that pads the map least; half
        # precision on the long row takes 64 query rows at least (K and V read half as often per score; on sm_90
        # the warp-group products)
        least = 64 if q.dtype != torch.float32 and lp.long_tiles('whole_fwd', n, q.dtype, cap) else 16
        block_m = query_block(n, cfg.block_m, least)
        tiles = lp.cdiv(n, block_m)
        # the map's sizes are constexprs: no division by a run-time width, no masks on a whole number of tiles
        # key tiles of any column count pad least; triton 3.6 spills them (docs/benchmarks.md): powers of two there,
        # and the H2V path's tables transposed (two copies per call); the chunk's tiles in the scores' layout cost
        # triton 3.6 more than the per-tile layout change
        pow2 = lp.triton_version() < (3, 7)
        cols_v = key_columns(ww, hh, cfg.block_n, pow2=pow2) if 'v2h' in names else 8
        cols_h = key_columns(hh, ww, cfg.block_n, pow2=pow2) if 'h2v' in names else 8
        # the FULL key tiles' products add the column table (half precision: its parts are bfloat16)
        fold = not pow2 and q.dtype != torch.float32 and n >= FOLD_TOKENS
        constexprs = dict(HH=hh, WW=ww, V2H='v2h' in names, H2V='h2v' in names, BLOCK_M=block_m, COLS_V=cols_v,
                          COLS_H=cols_h, BLOCK_N=cfg.block_n,
                          BLOCK_D=lp.pow2(d), BLOCK_DV=lp.pow2(dv), TABLES_T=pow2 and 'h2v' in names,
                          SCORES_LAYOUT=not pow2,
                          FOLD_V=fold and 'v2h' in names and (full_key_tiles(hh, cols_v, cfg.block_n) or
                                                              shifted_key_tiles(hh, ww, cols_v, cfg.block_n, block_m)),
                          FOLD_H=fold and 'h2v' in names and (full_key_tiles(ww, cols_h, cfg.block_n) or
                                                              shifted_key_tiles(ww, hh, cols_h, cfg.block_n, block_m)),
                          PRECISION=lp.precision(q.dtype),
                          # (the row maximum of the scores, then times the scale: a positive one)
                          IN_PRODUCT=not pow2 and bias_in_product(cap) and positive)
        plan = _FWD_PLANS[key] = ((tiles * bh, len(names)), constexprs, cfg, tiles)
    return plan


_FWD_PLANS = register_cache('whole_forward_launches', 1024)


def forward_launches(q, k, v, ca, cb, scale: float, form: str, cap: int):
    """The forward's launch (every path of ``form``, each V2H on its map: :func:`_whole_fwd`), after the column
    tables' parts' (:func:`_whole_fwd_parts`) where a path's products add them, and its outputs.
    q, k: (B, heads, H, W, d), k with q's strides; v: (B, heads, H, W, dv); channels contiguous; ca, cb: (B, heads,
    H, W) float32 contiguous tables. Outputs: o (paths, BH, H, W, dv) and lse (paths, BH, H, W), float32, in the
    image's token order and :func:`mmppma.ops.forms.paths` order."""
    b, heads, hh, ww, d = q.shape
    grid, constexprs, cfg, tiles = _fwd_plan(q, v, hh, ww, form, cap, scale > 0)
    o = torch.empty(grid[1], b * heads, hh, ww, v.shape[-1], device=q.device, dtype=torch.float32)
    lse = torch.empty(grid[1], b * heads, hh, ww, device=q.device, dtype=torch.float32)
    qs, vs = q.stride(), v.stride()
    # the H2V map's row and column tables, its rows contiguous, for triton 3.6 (:func:`_whole_fwd`)
    ct1, ct2 = ((cb.transpose(-1, -2).contiguous(), ca.transpose(-1, -2).contiguous()) if constexprs['TABLES_T']
                else (cb, ca))
    launches, parts = [], lse  # (any tensor where no path takes the parts)
    if constexprs['FOLD_V'] or constexprs['FOLD_H']:
        parts = torch.empty(grid[1], b * heads, hh * ww, 16, device=q.device, dtype=torch.bfloat16)
        launches.append(lp.Launch(_whole_fwd_parts, (lp.cdiv(hh * ww, PARTS_BLOCK), b * heads, grid[1]),
                                  (ca, cb, parts, 1.0 / scale, b * heads),
                                  dict(HH=hh, WW=ww, V2H=constexprs['V2H'], BLOCK=PARTS_BLOCK), PARTS_CONFIG,
                                  q.device))
    launches.append(lp.Launch(_whole_fwd, grid, (q, k, v, ca, cb, ct1, ct2, parts, o, lse, scale, heads, hh * ww, d,
                                                 v.shape[-1], qs[0], qs[1], qs[2], qs[3], vs[0], vs[1], vs[2], vs[3],
                                                 tiles, b * heads), constexprs, cfg, q.device))
    return launches, o, lse


#: :func:`_whole_fwd_parts`' tokens per program and configuration
PARTS_BLOCK = 256
PARTS_CONFIG = lp.Config(PARTS_BLOCK, 16, 4, 1)


#: below this capability the queries' launches of the backward on own tiles of BLOCK_OWN_APART tokens or more hold
#: one path each: two paths spill there (sm_80: 12 B at 255 registers; one path takes 248-255, and merged with the
#: keys' programs spills 8 B)
PATHS_APART_BELOW = 90
BLOCK_OWN_APART = 64


#: the triton from which the backward's keys may take tiles of 64 others over more than two rows
#: (:func:`_bwd_plans`)
WIDE_KEYS_FROM = (3, 7)


def _bwd_plans(q, v, hh: int, ww: int, form: str, cap: int):
    """Per kind (queries, keys): (grid, constexprs, config, tiles per slice, first path) of the backward's launches,
    cached per call site, and the corner slots per path (the most own tiles that touch one row of its forward map).
    A kind's paths share one launch when their maps take the same configuration, else one each."""
    key = (q.shape, v.shape[-1], q.dtype, cap, form, lp.precision(q.dtype))
    plans = _BWD_PLANS.get(key)
    if plans is not None:
        return plans
    queries, slots = _role_plans(q, v, hh, ww, form, cap, False, True)
    launches = roles_in_one_launch(queries + _role_plans(q, v, hh, ww, form, cap, True, True)[0])
    # the keys' tiles of 64 others over more than two rows stay so where that takes fewer launches (the roles'
    # paths in one, not two); elsewhere 32 others, as the queries' (the roles then share launches). Triton 3.6
    # spills them (16 B at 800 x 1344 stage 4)
    if lp.triton_version() >= WIDE_KEYS_FROM:
        wide = roles_in_one_launch(queries + _role_plans(q, v, hh, ww, form, cap, True, False)[0])
        if len(wide) < len(launches):
            launches = wide
    plans = _BWD_PLANS[key] = (launches, slots)
    return plans


def _role_plans(q, v, hh: int, ww: int, form: str, cap: int, keys: bool, narrow_rows: bool):
    """:func:`_bwd_plans`' launches of one role (KEYS: the keys'), and the queries' corner slots per path.
    ``narrow_rows``: tiles of 64 others over more than two rows take 32 others (the queries' always do: there a row
    more costs a product and they spill)."""
    bh, n, d, dv = q.shape[0] * q.shape[1], hh * ww, q.shape[-1], v.shape[-1]
    names = paths(form)
    launches, slots = [], {}
    family = 'whole_bwd_kv' if keys else 'whole_bwd_q'
    tiles = {}
    for path in names:
        # a path's queries run on its forward map, its keys on the transpose: the image (width W) or not (H)
        image = (path == 'v2h') != keys
        width = ww if image else hh
        cfg = lp.config(family, n, q.dtype, cap, width)
        # own tiles of consecutive map tokens: tensor-core tiles take 16 own rows per warp at least
        narrow = lp.narrow_tiles(family, n, q.dtype, cap, width)
        least = 16 * cfg.num_warps if q.dtype != torch.float32 and not narrow else 16
        own = query_block(n, cfg.block_m, least)
        # the (own x column) sums are held through the chunk (as 16 columns at least, the column spreader's
        # product): the largest tiles (128 x 64) take 32 columns at most (64 spill); a chunk of fewer than 16
        # columns only on tiles of 16 others (over 2 rows: a row more costs the queries' programs a product)
        cols = key_columns(width, n // width, cfg.block_n, least=min(16, cfg.block_n // 2),
                           most=32 if own * cfg.block_n >= 8192 else 128)
        if cfg.block_n // cols > 2 and cfg.block_n > 32 and (narrow_rows or not keys):
            cfg = dataclasses.replace(cfg, block_n=32)
            cols = key_columns(width, n // width, 32, least=16)
        tiles[path] = (cfg, image, own, cols)
        if not keys:
            slots[path] = corner_slots(width, own)
    # one launch for both paths where their maps take one configuration (but the queries' on large own tiles
    # below PATHS_APART_BELOW)
    apart = len({tiles[p][0] for p in names}) > 1 or (
        not keys and 0 < cap < PATHS_APART_BELOW and min(tiles[p][2] for p in names) >= BLOCK_OWN_APART)
    groups = [(p, ) for p in names] if apart else [names]
    for group in groups:
        cfg, _, own, _ = tiles[group[0]]
        cols_v = next((tiles[p][3] for p in group if tiles[p][1]), 16)
        cols_h = next((tiles[p][3] for p in group if not tiles[p][1]), 16)
        count = lp.cdiv(n, own)
        constexprs = dict(HH=hh, WW=ww, KEYS=keys, BOTH=False, V2H='v2h' in group, H2V='h2v' in group,
                          BLOCK_OWN=own,
                          COLS_V=cols_v, COLS_H=cols_h, BLOCK_OTHER=cfg.block_n, BLOCK_D=lp.pow2(d),
                          BLOCK_DV=lp.pow2(dv), PRECISION=lp.precision(q.dtype))
        launches.append(((count * bh, len(group)), constexprs, cfg, count, names.index(group[0])))
    return launches, slots


def roles_in_one_launch(plans):
    """The backward's launch plans with the queries' and the keys' launches of each group of paths merged into one
    (BOTH) where they take the same configuration, tiles and grid: a launch less per call (the two roles write
    apart: :func:`_whole_bwd`)."""
    queries = [plan for plan in plans if not plan[1]['KEYS']]
    keys = [plan for plan in plans if plan[1]['KEYS']]

    def uses(c, name):  # whether a launch's programs run on the image (COLS_V) or on its transpose (COLS_H)
        return any(((path == 'v2h') != c['KEYS']) == (name == 'COLS_V') for path in ('v2h', 'h2v')
                   if c[path.upper()])

    def alike(a, b):
        apart = dict(KEYS=None, COLS_V=None, COLS_H=None)
        return ((a[0], a[3], a[4], dict(a[1], **apart), dataclasses.replace(a[2], family='')) == (
            b[0], b[3], b[4], dict(b[1], **apart), dataclasses.replace(b[2], family=''))
                and all(a[1][name] == b[1][name] for name in ('COLS_V', 'COLS_H')
                        if uses(a[1], name) and uses(b[1], name)))
    if len(queries) != len(keys) or not all(alike(a, b) for a, b in zip(queries, keys)):
        return plans
    return [((grid[0], 2 * grid[1]), dict(c, BOTH=True, **{name: (c if uses(c, name) else k[1])[name]
                                                           for name in ('COLS_V', 'COLS_H')}), cfg, count, first)
            for (grid, c, cfg, count, first), k in zip(queries, keys)]


_BWD_PLANS = register_cache('whole_backward_launches', 1024)


def backward_launches(q, k, v, ca, cb, o, lse, dout, scale: float, form: str, cap: int):
    """The backward's launches (:func:`_whole_bwd`: the queries' programs of every path, then the keys', in one
    launch where they take the same tiles) and the float32 buffers they fill, in the image's order: dq (paths, BH,
    H, W, d), dk (paths, BH, H, W, d), dv (paths, BH, H, W, dv) and the table gradients (slots, 2, BH, H, W), whose
    sum over the slots is (dCa, dCb). q, k, v, dout: (B, heads, H, W, .) as :func:`forward_launches` takes them; o,
    lse as it returns them."""
    b, heads, hh, ww, d = q.shape
    bh, dv = b * heads, v.shape[-1]
    plans, slots = _bwd_plans(q, v, hh, ww, form, cap)
    count = len(paths(form))
    weight = 1.0 / count
    # rowsum(dP_p * P_p) = weight * (dout . o_p): the kernels weigh it
    delta = (o.view(count, b, heads, hh, ww, dv) * dout).sum(-1)
    f32 = dict(device=q.device, dtype=torch.float32)
    dq = torch.empty(count, bh, hh, ww, d, **f32)
    dk = torch.empty(count, bh, hh, ww, d, **f32)
    dv_ = torch.empty(count, bh, hh, ww, dv, **f32)
    slot_h = slots.get('v2h', 0)
    tables = torch.zeros(2 + slot_h + slots.get('h2v', 0), 2, bh, hh, ww, **f32)
    qs, vs, os_ = q.stride(), v.stride(), dout.stride()
    launches = []
    for grid, constexprs, cfg, tiles, first in plans:
        launches.append(lp.Launch(_whole_bwd, grid, (
            q, k, v, ca, cb, dout, lse[first:], delta[first:], dq[first:], dk[first:], dv_[first:], tables, scale,
            scale * LOG2E, weight, heads, hh * ww, d, dv, qs[0], qs[1], qs[2], qs[3], vs[0], vs[1], vs[2], vs[3],
            os_[0], os_[1], os_[2], os_[3], tiles, bh, 0, slot_h), constexprs, cfg, q.device))
    return launches, (dq, dk, dv_, tables)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ca: torch.Tensor, cb: torch.Tensor, scale: float,
             form: str, keep: bool = True) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (B, heads, H, W, d), v (B, heads, H, W, dv), as :func:`forward_launches` takes them -> the output
    (B, heads, H, W, dv) in v's dtype, and per path o (paths, BH, H, W, dv) and lse (paths, BH, H, W), float32.
    Without ``keep`` (nothing saves o) a one-path output may be a view of o."""
    launches, o, lse = forward_launches(q, k, v, ca, cb, scale, form, lp.capability(q.device))
    lp.run(launches)
    # equal weights: 1 path -> itself, 2 paths -> the release's average
    out = o.mean(0) if keep or o.shape[0] > 1 else o[0]
    return out.view(v.shape).to(v.dtype), o, lse


def _forward_shapes(q, k, v, ca, cb, scale, form):
    count = len(paths(form))
    b, heads, hh, ww = ca.shape
    return (v.new_empty(v.shape), v.new_empty(count, b * heads, hh, ww, v.shape[-1], dtype=torch.float32),
            v.new_empty(count, b * heads, hh, ww, dtype=torch.float32))


def _backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ca: torch.Tensor,
              cb: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, scale: float,
              form: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv in the inputs' dtypes and dCa, dCb (float32), shaped as the inputs, from the output gradient
    ``dout`` (B, heads, H, W, dv)."""
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    launches, (dq, dk, dv, tables) = backward_launches(q, k, v, ca, cb, o, lse, dout, scale, form,
                                                       lp.capability(q.device))
    lp.run(launches)
    grads = [(g[0] if g.shape[0] == 1 else g.sum(0)).view(x.shape).to(x.dtype) for g, x in ((dq, q), (dk, k), (dv, v))]
    dca, dcb = tables.sum(0)
    return (*grads, dca.view(ca.shape), dcb.view(cb.shape))


def _backward_shapes(dout, q, k, v, ca, cb, o, lse, scale, form):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), ca.new_empty(ca.shape),
            cb.new_empty(cb.shape))


# the ops as torch.compile sees them (one node each); eager calls take WHOLE_KERNELS below
def _op_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ca: torch.Tensor, cb: torch.Tensor, scale: float,
                form: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, ca, cb, scale, form)


whole_attention_op = lp.library_op('whole_attention_triton', _op_forward, _forward_shapes)
def _op_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ca: torch.Tensor,
                 cb: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, scale: float,
                 form: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dca, dcb = _backward(dout, q, k, v, ca, cb, o, lse, scale, form)
    return dq, dk, dv, dca, dcb.clone()  # a library op's outputs may not share storage: dca and dcb are one sum's


whole_attention_backward_op = lp.library_op('whole_attention_triton_backward', _op_backward, _backward_shapes)


def _save(ctx, inputs, output):
    q, k, v, ca, cb, scale, form = inputs
    ctx.save_for_backward(q, k, v, ca, cb, *output[1:])
    ctx.mark_non_differentiable(*output[1:])  # o and lse: saved for the backward
    ctx.args = (scale, form)


def _gradients(ctx, dout, do, dlse):
    return (*whole_attention_backward_op(dout, *ctx.saved_tensors, *ctx.args), None, None)


whole_attention_op.register_autograd(_gradients, setup_context=_save)


#: the eager path of :data:`whole_attention_op` (:class:`~mmppma.ops.triton_support.calls.KernelFunction`): o and lse
#: saved, not returned
WHOLE_KERNELS = (_forward, _backward, 5)
#: the inference path: nothing saves o, so a one-path output may be a view of it
_INFER = functools.partial(_forward, keep=False)


def whole_attention_triton(q, k, v, ca, cb, scale: float, form: str, caller: Caller,
                           traced: Optional[bool] = None):
    """Whole attention of ``form`` ('release' | 'v2h' | 'h2v'). q, k: (B, heads, H, W, d); v: (B, heads, H, W,
    dv); ca, cb: (B, heads, H, W) float32 decay tables; ``caller``: what errors name; ``traced``: whether
    torch.compile traces the call (None: ask; the ops' eager plans know it is not). An image narrower
    than ``lp.NARROW`` tokens and at least that tall runs transposed, so that a block of consecutive tokens spans
    few image rows: the transpose's rows are the columns here, its Ca is Cb and its 'v2h' path 'h2v'."""
    hh, ww = q.shape[2], q.shape[3]
    if ww < lp.NARROW <= hh:
        def t(x):
            return x.transpose(2, 3)
        return t(whole_attention_triton(t(q), t(k), t(v), t(cb), t(ca), scale, transposed(form), caller, traced))
    if abs(scale) < 1e-30:  # scores of zero; the backward divides the log-normaliser by the scale
        q, scale = q * 0, 1.0
    q, k, v = lp.kernel_layout(q, k, v)
    ca, cb = ca.float().contiguous(), cb.float().contiguous()
    return call_kernels(caller, whole_attention_op, WHOLE_KERNELS, _INFER, traced, q, k, v, ca, cb, float(scale),
                        form)


def ppma_attention_plan(q, k, v, la, lb, scale: float, form: str, tables: bool, traced: Optional[bool]):
    """The Triton path of :func:`~mmppma.ops.ppma_attention` (:class:`~mmppma.ops.plan.Op`)."""
    return on_tables(functools.partial(whole_attention_triton, scale=scale, form=form,
                                       caller=Caller.of('ppma_attention', q), traced=traced), tables)


def manhattan_attention_plan(q, k, v, log_decay, scale: float, traced: Optional[bool]):
    """The Triton path of :func:`~mmppma.ops.manhattan_attention`: whole attention's kernels on per-head decay
    tables."""
    caller = Caller.of('manhattan_attention', q)

    def manhattan(q, k, v, log_decay):
        return whole_attention_triton(q, k, v, *head_decay_tables(log_decay, q.shape[:-1]), scale, 'v2h', caller,
                                      traced)
    return manhattan
