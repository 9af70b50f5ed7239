"""Line attention, Triton kernels: masked softmax attention along image rows or columns (the two halves of
criss-cross attention).

For every line (a row: length W, or a column: length H) of a (BH, H, W, .) tensor:
``out[t] = sum_s softmax_s(scale * q_t . k_s + seg(C; t, s)) x_s`` with C the line's cumsum table.
Rows and columns are read in place through strides (no permute copies). Forward and backward are
flash-style loops over key blocks; the bias gradient is reduced into per-token partial sums owned by one
program each (no atomics). The grid is one axis of (line, block) programs, line-major: the lines (batch * heads *
rows or columns) pass CUDA's 65535 on the other axes at large batches.
"""
import dataclasses
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..caches import register_cache
from ..triton_support import launch as lp
from ..triton_support.calls import Caller, call_kernels
from ..triton_support.tiles import (
    add_normalisers,
    add_row_sums,
    head_offset,
    load_rows,
    load_tile,
    normalisers,
    online_softmax_start,
    row_sums,
    row_sums_start,
    store_tile,
    table_parts,
    token_block,
)

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


#: the parts of a line's other tokens, as seen from a block of own tokens (:func:`_parts`)
BEFORE = tl.constexpr(0)
MIXED = tl.constexpr(1)
AFTER = tl.constexpr(2)


@triton.jit
def _parts(own_start, L, BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr):
    """(lo, hi): the blocks of BLOCK_OTHER other tokens that hold the own tokens ``own_start ..
    own_start + BLOCK_OWN`` start at ``lo`` and end at ``hi`` (at most L). The other tokens before ``lo`` all
    come before every own token (BEFORE), those from ``hi`` on after them (AFTER): on a monotone table the segment
    sums of those blocks take one sign each, and only the MIXED blocks compare indices."""
    lo = own_start // BLOCK_OTHER * BLOCK_OTHER
    if BLOCK_OWN > BLOCK_OTHER:
        return lo, tl.minimum(lo + BLOCK_OWN, L)
    return lo, tl.minimum(lo + BLOCK_OTHER, L)


@triton.jit
def _row_part(c_own, PART: tl.constexpr):
    """The own tokens' share of the segment sums of a part, per own token, in log2 units: a segment's sum is the
    later token's table minus the earlier's (the table is monotone: minus the absolute difference)."""
    if PART == BEFORE:
        return c_own * LOG2E_
    if PART == AFTER:
        return -c_own * LOG2E_
    return tl.zeros_like(c_own)


@triton.jit
def _plus_other_part(s, c_own, c_other, PART: tl.constexpr):
    """``s`` plus the rest of the segment sums, natural units: per other token in the BEFORE and AFTER parts (a
    (1, other) row), per score in the MIXED part; its minus signs as subtractions (each an operand of the score's
    FMA, not an instruction per other token)."""
    if PART == BEFORE:
        return s - c_other[None, :]
    if PART == AFTER:
        return s + c_other[None, :]
    return s - tl.abs(c_own[:, None] - c_other[None, :])


@triton.jit
def _past_line(PART: tl.constexpr):
    """The table value that other tokens past the line read: a segment sum of -inf (no score, no per-score
    mask)."""
    if PART == AFTER:
        return float('-inf')
    return float('inf')


@triton.constexpr_function
def peels(masked, precision):
    """Whether a MASKED part's loop leaves the line's ragged last block to be read masked after it (no masks in the
    loop): with tensor-core products. Exact float32 products (on the FMA units, their operand tiles in registers)
    keep one masked loop: a second copy of the block's body spills there (500-550 B)."""
    return bool(masked) and precision != 'ieee'


@triton.jit
def _full_blocks_end(start, end, BLOCK: tl.constexpr, PEEL: tl.constexpr):
    """Where a part's loop over blocks of BLOCK other tokens from ``start`` (a multiple of BLOCK, or ``end``) stops:
    ``end``, or with PEEL (:func:`peels`) the start of the block that passes ``end`` (the line's last, read masked
    after the loop)."""
    if PEEL:
        return tl.maximum(start, end // BLOCK * BLOCK)
    return end


@triton.jit
def _rows(ptr, base, offs, step, cols):
    """Pointers to the rows of tokens ``base + offs * step`` (element offsets), channels ``cols`` contiguous."""
    return ptr + (base + offs * step)[:, None] + cols[None, :]


@triton.jit
def _other_block(a_ptrs, b_ptrs, c_ptr, tok, in_line, a_mask, b_mask, PART: tl.constexpr, MASKED: tl.constexpr):
    """One block of the other tokens: its two operand tiles and its table entries (``MASKED``: past the line, zero
    operands and the table value that gives the part a bias of -inf)."""
    if MASKED:
        return (tl.load(a_ptrs, mask=in_line[:, None] & a_mask, other=0.0),
                tl.load(b_ptrs, mask=in_line[:, None] & b_mask, other=0.0),
                tl.load(c_ptr + tok, mask=in_line, other=_past_line(PART)))
    return tl.load(a_ptrs, mask=a_mask, other=0.0), tl.load(b_ptrs, mask=b_mask, other=0.0), tl.load(c_ptr + tok)


@triton.jit
def _part_signs(BLOCK: tl.constexpr, COLUMNS: tl.constexpr, TABLE: tl.constexpr, LSE: tl.constexpr):
    """The (BLOCK x 16) bfloat16 tile whose product with a block of other tokens' parts (:func:`_line_fwd`) is TABLE
    times the pass's table plus LSE times the pass's lse, over the scale, per other token: TABLE in the table's
    three columns, LSE in the lse's, zeros elsewhere."""
    cols = tl.arange(0, 16)
    table = 3 if COLUMNS else 0
    signs = tl.where((cols >= table) & (cols < table + 3), TABLE, tl.where((cols >= table + 6) & (cols < table + 9),
                                                                          LSE, 0.0))
    return tl.broadcast_to(signs.to(tl.bfloat16)[None, :], (BLOCK, 16))


@triton.jit
def _folded_block(a, signs, b_ptrs, db_ptrs, parts_ptr, tok, b_mask, db_mask, PRECISION: tl.constexpr):
    """One block of the other tokens within the line (no masks past it): its two operand tiles and the scores' product
    ``a b^T`` plus the product of ``signs`` (:func:`_part_signs`) with the block's parts (:func:`_line_fwd`), in
    units of 1 / scale."""
    b = tl.load(b_ptrs, mask=b_mask, other=0.0)
    db = tl.load(db_ptrs, mask=db_mask, other=0.0)
    parts = tl.load(parts_ptr + tok[:, None] * 16 + tl.arange(0, 16)[None, :])
    return b, db, tl.dot(a, tl.trans(b), tl.dot(signs, tl.trans(parts)), input_precision=PRECISION)


@triton.jit
def _fwd_block(q, c_own, row, m_i, l_i, acc, k_ptrs, x_ptrs, c_ptr, parts_ptr, side, tok, in_line, k_step, x_step,
               c_step, k_mask, x_mask, scale, BLOCK_N: tl.constexpr, PART: tl.constexpr, MASKED: tl.constexpr,
               PRECISION: tl.constexpr, LSE_GIVEN: tl.constexpr, FOLD: tl.constexpr):
    """Fold one key block of a part into the online softmax (:func:`_fwd_part`); the state and the pointers moved
    to the next block. With LSE_GIVEN ``row`` holds the part's row term minus the rows' log-normaliser: the
    probabilities are final (no running maximum, no rescaling, no sums). With FOLD (a BEFORE or AFTER part, not
    MASKED) the scores' product adds the keys' table over the scale, -C / scale before the queries and C / scale
    after them, from its three bfloat16 parts per key (:func:`_line_fwd`) by a product with ``side``, a (query x
    16) column of the part's sign: no table term per score."""
    if FOLD and PART != MIXED and not MASKED:
        k, x, y = _folded_block(q, side, k_ptrs, x_ptrs, parts_ptr, tok, k_mask, x_mask, PRECISION)
        unit = scale * LOG2E_  # y is in units of 1 / scale
    else:
        k, x, c = _other_block(k_ptrs, x_ptrs, c_ptr, tok, in_line, k_mask, x_mask, PART, MASKED)
        y = _plus_other_part(tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale, c_own, c, PART)
        unit = LOG2E_
    if LSE_GIVEN:
        p = tl.math.exp2(y * unit + row[:, None]).to(x.dtype)
        acc = tl.dot(p, x, acc, input_precision=PRECISION)
        return m_i, l_i, acc, k_ptrs + BLOCK_N * k_step, x_ptrs + BLOCK_N * x_step, tok + BLOCK_N * c_step
    m_new = tl.maximum(m_i, tl.max(y, 1) * unit + row)
    p = tl.math.exp2(y * unit - (m_new - row)[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    p = p.to(x.dtype)
    l_i = add_normalisers(l_i, p, alpha, PRECISION)
    acc = tl.dot(p, x, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc, k_ptrs + BLOCK_N * k_step, x_ptrs + BLOCK_N * x_step, tok + BLOCK_N * c_step


@triton.jit
def _fwd_part(q, c_own, m_i, l_i, acc, k_ptrs, x_ptrs, c_ptr, parts_ptr, tok, keys, start, end, L, k_step, x_step,
              c_step, k_mask, x_mask, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PART: tl.constexpr,
              MASKED: tl.constexpr, PRECISION: tl.constexpr, LSE_GIVEN: tl.constexpr, COLUMNS: tl.constexpr,
              FOLD: tl.constexpr):
    """Fold the key blocks at ``start, start + BLOCK_N, .. < end`` of one part (:func:`_parts`) into the online
    softmax (m_i, l_i, acc; log2 units); the MIXED part's blocks unrolled (they are the query block's span: no
    loop). The tiles' pointers are those of the line's first key block, moved to ``start`` and on by increments,
    ``tok`` (the keys' offsets in the table) likewise; with MASKED, keys past the line are read as zeros and a
    table of :func:`_past_line`, in the one block that reaches past it (:func:`peels`). The logits are
    the scores times ``scale`` plus :func:`_plus_other_part` (one FMA per score), times log2(e), plus the part's
    :func:`_row_part`, which is folded into the row maximum's shift. With LSE_GIVEN, m_i is the rows'
    log-normaliser (log2 units), which the row term takes off once per part."""
    k_ptrs += start * k_step
    x_ptrs += start * x_step
    tok += start * c_step
    row = _row_part(c_own, PART)
    if LSE_GIVEN:
        row -= m_i
    side = None
    if FOLD and PART != MIXED:
        side = _part_signs(BLOCK_M, COLUMNS, -1.0 if PART == BEFORE else 1.0, 0.0)
    if PART == MIXED:
        for i in tl.static_range((BLOCK_M + BLOCK_N - 1) // BLOCK_N):
            m_i, l_i, acc, k_ptrs, x_ptrs, tok = _fwd_block(
                q, c_own, row, m_i, l_i, acc, k_ptrs, x_ptrs, c_ptr, parts_ptr, side, tok,
                start + i * BLOCK_N + keys < L, k_step, x_step, c_step, k_mask, x_mask, scale, BLOCK_N, PART, MASKED,
                PRECISION, LSE_GIVEN, FOLD)
    else:
        PEEL: tl.constexpr = peels(MASKED, PRECISION)
        full = _full_blocks_end(start, end, BLOCK_N, PEEL)
        for n in range(start, full, BLOCK_N):
            m_i, l_i, acc, k_ptrs, x_ptrs, tok = _fwd_block(
                q, c_own, row, m_i, l_i, acc, k_ptrs, x_ptrs, c_ptr, parts_ptr, side, tok, n + keys < L, k_step,
                x_step, c_step, k_mask, x_mask, scale, BLOCK_N, PART, MASKED and not PEEL, PRECISION, LSE_GIVEN,
                FOLD)
        if PEEL:
            if full < end:
                m_i, l_i, acc, k_ptrs, x_ptrs, tok = _fwd_block(
                    q, c_own, row, m_i, l_i, acc, k_ptrs, x_ptrs, c_ptr, parts_ptr, side, tok, full + keys < L,
                    k_step, x_step, c_step, k_mask, x_mask, scale, BLOCK_N, PART, True, PRECISION, LSE_GIVEN, FOLD)
    return m_i, l_i, acc


@triton.jit
def _line_fwd(q_ptr, k_ptr, x_ptr, c_ptr, c2_ptr, parts_ptr, o_ptr, lse_ptr, m_ptr, scale, heads, H, W, L, n_lines,
              D, DX, q_b, q_n, q_h, q_w, x_b, x_n, x_h, x_w, r_off, m_b, m_n, m_h, m_w, COLUMNS: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_X: tl.constexpr,
              PRECISION: tl.constexpr, RAGGED: tl.constexpr, MEAN: tl.constexpr, LSE_GIVEN: tl.constexpr,
              FOLD: tl.constexpr, WRITE_TABLES: tl.constexpr, WRITE_LSE: tl.constexpr):
    """One program per (line, query block): the online softmax over the line's key blocks, in three parts
    (:func:`_parts`: the keys before the queries' blocks, the blocks holding them, the keys after), log2 units.
    The log-decays are <= 0 (the ops' contract), so the table is monotone along the line and a segment's sum is
    the later token's table minus the earlier's: one sign per part outside the blocks holding the queries, minus
    the absolute difference inside them (no per-score compare). Keys past the line read the table as
    :func:`_past_line`: a bias of -inf, no per-score mask; RAGGED (:func:`ragged`) masks the loads of
    the line's last block in the part after the queries, the only one that can reach past the line, and the mixed
    part's always.
    q, k (B, heads, H, W, d) with strides (q_b, q_n, q_h, q_w, 1), x likewise; the table c, o and lse are
    contiguous (BH, H, W, .). With MEAN the program also stores the mean of the output and a residual r, read at
    x's strides ``r_off`` elements after x, at ``m_ptr`` (strides m_b, m_n, m_h, m_w, 1; its dtype). With
    LSE_GIVEN the rows' log-normaliser is read from ``lse_ptr`` (an earlier pass's over the same scores), not
    stored: each probability is final where it is computed, so the loop keeps no running maximum or sums.
    ``parts`` (BH, H, W, 16) bfloat16 holds, over the scale, in three bfloat16 parts each (:func:`table_parts`):
    the row table in columns 0-2, the column table in 3-5, the row pass's lse in 6-8, the column pass's in 9-11,
    zeros in 12-15. FOLD: the key blocks before and after the queries' take the table from there, in the scores'
    product (:func:`_fwd_block`). WRITE_TABLES: the program writes its own tokens' row of the parts (the tables
    from c and ``c2``, the other direction's table, contiguous as c, and its lse), for the passes after it and
    the backward; WRITE_LSE: only its lse's columns."""
    blocks = tl.cdiv(L, BLOCK_M)
    line = tl.program_id(0) // blocks
    q_ptr, k_ptr, x_ptr, c_ptr, first, c_base, c_step, q_base, q_step, x_base, x_step = _on_strided_line(
        line, n_lines, heads, H, W, q_ptr, k_ptr, x_ptr, c_ptr, q_b, q_n, q_h, q_w, x_b, x_n, x_h, x_w, COLUMNS)
    o_ptr += first * DX
    lse_ptr += first
    parts_ptr += first * 16
    own_start = tl.program_id(0) % blocks * BLOCK_M
    offs_m, mask_m, tok_m = token_block(own_start, BLOCK_M, L, c_base, c_step)
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    q = load_rows(q_ptr, q_base + offs_m * q_step, mask_m, offs_d, D)
    c_m = tl.load(c_ptr + tok_m, mask=mask_m, other=0.0)
    keys = tl.arange(0, BLOCK_N)
    k_ptrs = _rows(k_ptr, q_base, keys, q_step, offs_d)
    x_ptrs = _rows(x_ptr, x_base, keys, x_step, offs_x)
    tok = c_base + keys * c_step
    k_mask = offs_d[None, :] < D
    x_mask = offs_x[None, :] < DX
    lo, hi = _parts(own_start, L, BLOCK_M, BLOCK_N)
    m_i, l_i, acc = online_softmax_start(BLOCK_M, BLOCK_X, PRECISION)
    if LSE_GIVEN:
        m_i = tl.load(lse_ptr + tok_m, mask=mask_m, other=0.0) * LOG2E_
    state = _fwd_part(q, c_m, m_i, l_i, acc, k_ptrs, x_ptrs, c_ptr, parts_ptr, tok, keys, 0, lo, L, q_step, x_step,
                      c_step, k_mask, x_mask, scale, BLOCK_M, BLOCK_N, BEFORE, False, PRECISION, LSE_GIVEN, COLUMNS,
                      FOLD)
    state = _fwd_part(q, c_m, *state, k_ptrs, x_ptrs, c_ptr, parts_ptr, tok, keys, lo, hi, L, q_step, x_step, c_step,
                      k_mask, x_mask, scale, BLOCK_M, BLOCK_N, MIXED, True, PRECISION, LSE_GIVEN, COLUMNS, FOLD)
    m_i, l_i, acc = _fwd_part(q, c_m, *state, k_ptrs, x_ptrs, c_ptr, parts_ptr, tok, keys, hi, L, L, q_step, x_step,
                              c_step, k_mask, x_mask, scale, BLOCK_M, BLOCK_N, AFTER, RAGGED, PRECISION, LSE_GIVEN,
                              COLUMNS, FOLD)
    if LSE_GIVEN:
        o = acc
    else:
        l_i = normalisers(l_i)
        o = acc / l_i[:, None]
        lse = (m_i + tl.math.log2(l_i)) * _LN2  # the backward's: natural units
        tl.store(lse_ptr + tok_m, lse, mask=mask_m)
        cols = tl.arange(0, 16)
        lse_parts = table_parts(lse * (1.0 / scale), 9 if COLUMNS else 6)
        if WRITE_TABLES:
            c2_m = tl.load(c2_ptr + first + tok_m, mask=mask_m, other=0.0)
            rows, columns = (c2_m, c_m) if COLUMNS else (c_m, c2_m)
            store_tile(parts_ptr, tok_m, mask_m, cols, 16, table_parts(rows * (1.0 / scale), 0)
                       + table_parts(columns * (1.0 / scale), 3) + lse_parts)
        elif WRITE_LSE:  # (the other columns as they are)
            own = (cols >= (9 if COLUMNS else 6)) & (cols < (12 if COLUMNS else 9))
            tl.store(parts_ptr + tok_m[:, None] * 16 + cols[None, :], lse_parts, mask=mask_m[:, None] & own[None, :])
    store_tile(o_ptr, tok_m, mask_m, offs_x, DX, o)
    if MEAN:
        r = load_rows(x_ptr + r_off, x_base + offs_m * x_step, mask_m, offs_x, DX)
        m_off, m_base, m_step = _strided_line(line, n_lines, heads, m_b, m_n, m_h, m_w, COLUMNS)
        tl.store(m_ptr + m_off + (m_base + offs_m * m_step)[:, None] + offs_x[None, :],
                 ((o + r.to(tl.float32)) * 0.5).to(m_ptr.dtype.element_ty),
                 mask=mask_m[:, None] & (offs_x[None, :] < DX))


@triton.jit
def _bwd_block(a, da, c_own, row, delta_own, own, g1, g2, gc, b_ptrs, db_ptrs, c_ptr, lse_ptr, delta_ptr, parts_ptr,
               signs, tok, n, others, L, b_step, db_step, c_step, b_mask, db_mask, scale, BLOCK_OTHER: tl.constexpr,
               PART: tl.constexpr, MASKED: tl.constexpr, KEYS: tl.constexpr, PRECISION: tl.constexpr,
               SUMS_BY_DOT: tl.constexpr, FOLD: tl.constexpr, VALUES_ONLY: tl.constexpr = False):
    """Add the other block at ``n`` of a part to the sums (:func:`_bwd_part`); the sums and the pointers moved to
    the next block. With FOLD (a BEFORE or AFTER part, not MASKED) the scores' product adds the other tokens' table
    and (KEYS) lse terms over the scale from their parts (:func:`_line_fwd`), by a product with ``signs``
    (:func:`_part_signs`). VALUES_ONLY (KEYS): g2 alone, P^T dO (no score gradient)."""
    in_line = n + others < L
    if FOLD and PART != MIXED and not MASKED:
        b, db, s = _folded_block(a, signs, b_ptrs, db_ptrs, parts_ptr, tok, b_mask, db_mask, PRECISION)
        unit = scale * LOG2E_  # s is in units of 1 / scale
        if KEYS:
            delta = tl.load(delta_ptr + tok)[None, :]
        else:
            delta = delta_own[:, None]
    else:
        b, db, c = _other_block(b_ptrs, db_ptrs, c_ptr, tok, in_line, b_mask, db_mask, PART, MASKED)
        s = tl.dot(a, tl.trans(b), input_precision=PRECISION) * scale
        unit = LOG2E_
        if KEYS:
            if MASKED:
                lse = tl.load(lse_ptr + tok, mask=in_line, other=0.0)
                delta = tl.load(delta_ptr + tok, mask=in_line, other=0.0)[None, :]
            else:
                lse = tl.load(lse_ptr + tok)
                delta = tl.load(delta_ptr + tok)[None, :]
            if PART == BEFORE:  # the part and the other tokens' lse as one term per other token
                s = s - (c + lse)[None, :]
            elif PART == AFTER:
                s = s + (c - lse)[None, :]
            else:
                s = _plus_other_part(s, c_own, c, PART) - lse[None, :]
        else:
            s = _plus_other_part(s, c_own, c, PART)
            delta = delta_own[:, None]
    p = tl.math.exp2(s * unit + row[:, None])
    if KEYS:
        g2 = tl.dot(p.to(db.dtype), db, g2, input_precision=PRECISION)
    if not VALUES_ONLY:
        ds = p * (tl.dot(da, tl.trans(db), input_precision=PRECISION) - delta)
        ds_b = ds.to(b.dtype)
        if PART == MIXED:
            order = own[:, None] - (n + others)[None, :]
            gc = add_row_sums(gc, tl.where(order > 0, ds, tl.where(order < 0, -ds, 0.0)), 1.0, False, PRECISION)
        elif SUMS_BY_DOT:
            gc = add_row_sums(gc, ds_b, 1.0 if PART == BEFORE else -1.0, True, PRECISION)
        else:
            gc = add_row_sums(gc, ds, 1.0 if PART == BEFORE else -1.0, False, PRECISION)
        g1 = tl.dot(ds_b, b, g1, input_precision=PRECISION)
    return g1, g2, gc, b_ptrs + BLOCK_OTHER * b_step, db_ptrs + BLOCK_OTHER * db_step, tok + BLOCK_OTHER * c_step


@triton.jit
def _bwd_part(a, da, c_own, row_lse, delta_own, own, g1, g2, gc, b_ptrs, db_ptrs, c_ptr, lse_ptr, delta_ptr,
              parts_ptr, tok, others, start, end, L, b_step, db_step, c_step, b_mask, db_mask, scale,
              BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr, PART: tl.constexpr, MASKED: tl.constexpr,
              KEYS: tl.constexpr, PRECISION: tl.constexpr, SUMS_BY_DOT: tl.constexpr, COLUMNS: tl.constexpr,
              FOLD: tl.constexpr, VALUES_ONLY: tl.constexpr = False):
    """Add the other blocks at ``start, start + BLOCK_OTHER, .. < end`` of one part (:func:`_parts`) to a backward
    program's sums g1, g2 (KEYS) and gc; the MIXED part's blocks unrolled (the own block's span: no loop). The
    tiles' pointers are those of the line's first other block, moved to ``start`` and on by increments; ``tok``:
    the other tokens' offsets in the table, lse and delta (lse and delta: KEYS only), likewise; MASKED as
    :func:`_fwd_part`. The probabilities are recomputed as the forward computes
    them: the scores times ``scale`` plus the per-other-token terms (:func:`_plus_other_part`, the keys' programs: minus
    the other tokens' lse), times log2(e), plus the per-own-token ones (the part's :func:`_row_part`, the queries'
    programs: minus ``row_lse``, their lse in log2 units): two FMAs per score. The table gradient's sign is the
    part's (BEFORE +, AFTER -); in the MIXED part, by index (own after other +, before -; a token with itself 0:
    its query's and key's terms cancel)."""
    b_ptrs += start * b_step
    db_ptrs += start * db_step
    tok += start * c_step
    row = _row_part(c_own, PART)
    if not KEYS:
        row -= row_lse
    signs = None
    if FOLD and PART != MIXED:  # the other tokens' table (the part's sign) and, in the keys' programs, minus their lse
        signs = _part_signs(BLOCK_OWN, COLUMNS, -1.0 if PART == BEFORE else 1.0, -1.0 if KEYS else 0.0)
    if PART == MIXED:
        for i in tl.static_range((BLOCK_OWN + BLOCK_OTHER - 1) // BLOCK_OTHER):
            g1, g2, gc, b_ptrs, db_ptrs, tok = _bwd_block(
                a, da, c_own, row, delta_own, own, g1, g2, gc, b_ptrs, db_ptrs, c_ptr, lse_ptr, delta_ptr, parts_ptr,
                signs, tok, start + i * BLOCK_OTHER, others, L, b_step, db_step, c_step, b_mask, db_mask, scale,
                BLOCK_OTHER, PART, MASKED, KEYS, PRECISION, SUMS_BY_DOT, FOLD, VALUES_ONLY)
    else:
        PEEL: tl.constexpr = peels(MASKED, PRECISION)
        full = _full_blocks_end(start, end, BLOCK_OTHER, PEEL)
        for n in range(start, full, BLOCK_OTHER):
            g1, g2, gc, b_ptrs, db_ptrs, tok = _bwd_block(
                a, da, c_own, row, delta_own, own, g1, g2, gc, b_ptrs, db_ptrs, c_ptr, lse_ptr, delta_ptr, parts_ptr,
                signs, tok, n, others, L, b_step, db_step, c_step, b_mask, db_mask, scale, BLOCK_OTHER, PART,
                MASKED and not PEEL, KEYS, PRECISION, SUMS_BY_DOT, FOLD, VALUES_ONLY)
        if PEEL:
            if full < end:
                g1, g2, gc, b_ptrs, db_ptrs, tok = _bwd_block(
                    a, da, c_own, row, delta_own, own, g1, g2, gc, b_ptrs, db_ptrs, c_ptr, lse_ptr, delta_ptr,
                    parts_ptr, signs, tok, full, others, L, b_step, db_step, c_step, b_mask, db_mask, scale,
                    BLOCK_OTHER, PART, True, KEYS, PRECISION, SUMS_BY_DOT, FOLD, VALUES_ONLY)
    return g1, g2, gc


@triton.constexpr_function
def sums_by_dot(precision, keys, block_own, block_x):
    """Whether a backward program sums the table gradient's rows of the parts before and after its own block by
    products (:func:`~mmppma.ops.triton_support.tiles.add_row_sums`): with tensor-core products, but not in the
    keys' programs of 64 own tokens with 64 value channels or more (their 16 sum columns would spill)."""
    return precision != 'ieee' and not (keys and block_own * block_x >= 64 * 64)


@triton.constexpr_function
def keys_full(block_own, block_d, block_x):
    """Whether the keys' programs of a backward have no registers left for the parts' product: those of 32 own
    tokens at head dim 32 with 64 value channels (254 registers on sm_80 without it; 40 B spilled with it)."""
    return block_own <= 32 and block_d >= 32 and block_x >= 64


@triton.jit
def _bwd_role(q_ptr, k_ptr, x_ptr, c_ptr, do_ptr, lse_ptr, delta_ptr, parts_ptr, scale, L, D, DX, c_own, own_start,
              offs, mask, tok, c_base, c_step, q_base, q_step, x_base, x_step, o_base, o_step, KEYS: tl.constexpr,
              COLUMNS: tl.constexpr, BLOCK_OWN: tl.constexpr, BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_X: tl.constexpr, PRECISION: tl.constexpr, RAGGED: tl.constexpr, FOLD: tl.constexpr,
              VALUES_ONLY: tl.constexpr = False):
    """One role's sums for a block of own tokens (:func:`_line_bwd`): (g1, g2, gc) - KEYS: dk / scale, dx and the
    keys' table-gradient part (VALUES_ONLY: dx alone, the others zero); else dq / scale, g1 again and the
    queries'."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    others = tl.arange(0, BLOCK_OTHER)
    if KEYS:
        a = load_rows(k_ptr, q_base + offs * q_step, mask, offs_d, D)
        da = load_rows(x_ptr, x_base + offs * x_step, mask, offs_x, DX)
        b_ptrs = _rows(q_ptr, q_base, others, q_step, offs_d)
        db_ptrs = _rows(do_ptr, o_base, others, o_step, offs_x)
        b_step, db_step = q_step, o_step
        row_lse = tl.zeros_like(c_own)
        delta = tl.zeros_like(c_own)
    else:
        a = load_rows(q_ptr, q_base + offs * q_step, mask, offs_d, D)
        da = load_rows(do_ptr, o_base + offs * o_step, mask, offs_x, DX)
        b_ptrs = _rows(k_ptr, q_base, others, q_step, offs_d)
        db_ptrs = _rows(x_ptr, x_base, others, x_step, offs_x)
        b_step, db_step = q_step, x_step
        row_lse = tl.load(lse_ptr + tok, mask=mask, other=0.0) * LOG2E_
        delta = tl.load(delta_ptr + tok, mask=mask, other=0.0)
    SUMS_BY_DOT: tl.constexpr = sums_by_dot(PRECISION, KEYS, BLOCK_OWN, BLOCK_X)
    t_off = c_base + others * c_step  # the other tokens' in the table, lse and delta
    b_mask = offs_d[None, :] < D
    db_mask = offs_x[None, :] < DX
    lo, hi = _parts(own_start, L, BLOCK_OWN, BLOCK_OTHER)
    ptrs = (b_ptrs, db_ptrs, c_ptr, lse_ptr, delta_ptr, parts_ptr, t_off)
    state = (tl.zeros([BLOCK_OWN, BLOCK_D], tl.float32), tl.zeros([BLOCK_OWN, BLOCK_X], tl.float32),
             row_sums_start(BLOCK_OWN, SUMS_BY_DOT))
    state = _bwd_part(a, da, c_own, row_lse, delta, offs, *state, *ptrs, others, lo, hi, L, b_step, db_step, c_step,
                      b_mask, db_mask, scale, BLOCK_OWN, BLOCK_OTHER, MIXED, True, KEYS, PRECISION,
                      SUMS_BY_DOT, COLUMNS, FOLD, VALUES_ONLY)
    state = _bwd_part(a, da, c_own, row_lse, delta, offs, *state, *ptrs, others, 0, lo, L, b_step, db_step, c_step,
                      b_mask, db_mask, scale, BLOCK_OWN, BLOCK_OTHER, BEFORE, False, KEYS, PRECISION,
                      SUMS_BY_DOT, COLUMNS, FOLD, VALUES_ONLY)
    g1, g2, gc = _bwd_part(a, da, c_own, row_lse, delta, offs, *state, *ptrs, others, hi, L, L, b_step, db_step,
                           c_step, b_mask, db_mask, scale, BLOCK_OWN, BLOCK_OTHER, AFTER, RAGGED, KEYS, PRECISION,
                           SUMS_BY_DOT, COLUMNS, FOLD, VALUES_ONLY)
    return g1, g2, row_sums(gc)


@triton.jit
def _bwd_line_block(q_ptr, k_ptr, x_ptr, c_ptr, do_ptr, lse_ptr, delta_ptr, scale, L, D, DX, offs, mask, tok, q_base,
                    q_step, x_base, x_step, o_base, o_step, c_base, c_step, BLOCK: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_X: tl.constexpr, PRECISION: tl.constexpr):
    """Both roles' sums on a line of one block (:func:`_line_bwd`'s ONE_BLOCK) from one (query x key) tile of scores:
    (dq, dk, dx, gc). P and dS are the line's; dq = scale dS k, dk = scale dS^T q, dx = P^T dO; gc sums sgn(query
    - key) dS over the keys (the queries' part) and minus it over the queries (the keys'). The key block is read in
    a loop over the line's key blocks, as the other kernels read theirs (one iteration: the line is one block).
    Tokens past the line read a table of +inf as keys and an lse of +inf as queries: their probabilities are 0."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_x = tl.arange(0, BLOCK_X)
    q = load_rows(q_ptr, q_base + offs * q_step, mask, offs_d, D)
    do = load_rows(do_ptr, o_base + offs * o_step, mask, offs_x, DX)
    c_q = tl.load(c_ptr + tok, mask=mask, other=0.0)
    lse = tl.load(lse_ptr + tok, mask=mask, other=float('inf')) * LOG2E_
    delta = tl.load(delta_ptr + tok, mask=mask, other=0.0)
    dq = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    dk = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    dx = tl.zeros([BLOCK, BLOCK_X], tl.float32)
    by_query = tl.zeros([BLOCK], tl.float32)
    by_key = tl.zeros([BLOCK], tl.float32)
    for start in range(0, L, BLOCK):
        keys = start + tl.arange(0, BLOCK)
        in_line = keys < L
        k = load_rows(k_ptr, q_base + keys * q_step, in_line, offs_d, D)
        x = load_rows(x_ptr, x_base + keys * x_step, in_line, offs_x, DX)
        c_k = tl.load(c_ptr + c_base + keys * c_step, mask=in_line, other=float('inf'))
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale - tl.abs(c_q[:, None] - c_k[None, :])
        p = tl.math.exp2(s * LOG2E_ - lse[:, None])
        dx = tl.dot(tl.trans(p.to(do.dtype)), do, dx, input_precision=PRECISION)
        ds = p * (tl.dot(do, tl.trans(x), input_precision=PRECISION) - delta[:, None])
        order = offs[:, None] - keys[None, :]
        signed = tl.where(order > 0, ds, tl.where(order < 0, -ds, 0.0))
        by_query += tl.sum(signed, 1)
        by_key += tl.sum(signed, 0)
        ds = ds.to(q.dtype)
        dq = tl.dot(ds, k, dq, input_precision=PRECISION)
        dk = tl.dot(tl.trans(ds), q, dk, input_precision=PRECISION)
    return dq * scale, dk * scale, dx, by_query - by_key


@triton.jit
def _write(ptr, tok, mask, cols, n, value, ACC: tl.constexpr):
    """Store a (token x n) float32 tile at the tokens' rows, or (ACC) add it to what they hold."""
    if ACC:
        value += load_tile(ptr, tok, mask, cols, n)
    store_tile(ptr, tok, mask, cols, n, value)


@triton.jit
def _line_bwd(q_ptr, k_ptr, x_ptr, c_ptr, do_ptr, lse_ptr, delta_ptr, parts_ptr, dq_ptr, dk_ptr, dx_ptr, gc_ptr,
              scale, heads, H, W, L, n_lines, D, DX, q_b, q_n, q_h, q_w, x_b, x_n, x_h, x_w, o_b, o_n, o_h, o_w,
              KEYS: tl.constexpr, BOTH: tl.constexpr, COLUMNS: tl.constexpr, BLOCK_OWN: tl.constexpr,
              BLOCK_OTHER: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_X: tl.constexpr, PRECISION: tl.constexpr,
              RAGGED: tl.constexpr, ACC_DQ: tl.constexpr, ACC_DK: tl.constexpr, ACC_GC: tl.constexpr,
              FOLD: tl.constexpr, ONE_BLOCK: tl.constexpr, VALUES_ONLY: tl.constexpr):
    """One program per block of BLOCK_OWN keys (KEYS: dk and dx) or queries (dq) of one line, or (BOTH, where own
    and other blocks are equal: :func:`roles_in_one_launch`) the queries' role and then the keys' on the same
    block: a launch less per pass (the keys' first take more registers: their sums' offsets are kept for the
    queries').
    Each role loops over the line's other tokens in the forward's three parts, MIXED first (fewer registers live
    there; :func:`_bwd_part`; RAGGED: :func:`ragged`). gc is the table gradient: the own tokens' part, sum over
    the other tokens of sgn(query - key) dS (the segment-sum convention; a token's terms with itself cancel),
    added by the queries' role and subtracted by the keys'. With ACC_DQ, ACC_DK / ACC_GC the program adds dq, dk
    / gc to what the buffer holds (an earlier launch's), else stores it: one writer per token in a launch, so the
    sums are in launch order. Tiles are (own x other tokens). Own tokens past the line compute rows that are never
    stored. q, k, x and the output gradient are read by strides ((B, heads, H, W, .), strides (x_b, x_n, x_h,
    x_w, 1)); the table, lse, delta and the gradients (float32) are contiguous. FOLD: the other blocks before and
    after the own block's take the other tokens' table and (the keys' role, unless :func:`keys_full`) lse from the
    forward's ``parts`` (:func:`_line_fwd`) in the scores' product. ONE_BLOCK (lines of one block, own and other):
    one program per line computes both roles from one tile of scores (:func:`_bwd_line_block`; KEYS, BOTH and
    FOLD aside). VALUES_ONLY (KEYS): dx alone, P^T dO (:func:`backward_launches`' ``values_only``); dk and gc are not
    written."""
    line = tl.program_id(0) // tl.cdiv(L, BLOCK_OWN)
    q_ptr, k_ptr, x_ptr, c_ptr, first, c_base, c_step, q_base, q_step, x_base, x_step = _on_strided_line(
        line, n_lines, heads, H, W, q_ptr, k_ptr, x_ptr, c_ptr, q_b, q_n, q_h, q_w, x_b, x_n, x_h, x_w, COLUMNS)
    o_off, o_base, o_step = _strided_line(line, n_lines, heads, o_b, o_n, o_h, o_w, COLUMNS)
    do_ptr += o_off
    lse_ptr += first
    delta_ptr += first
    parts_ptr += first * 16
    gc_ptr += first
    own_start = tl.program_id(0) % tl.cdiv(L, BLOCK_OWN) * BLOCK_OWN
    offs, mask, tok = token_block(own_start, BLOCK_OWN, L, c_base, c_step)
    offs_d = tl.arange(0, BLOCK_D)
    c_own = tl.load(c_ptr + tok, mask=mask, other=0.0)
    args = (q_ptr, k_ptr, x_ptr, c_ptr, do_ptr, lse_ptr, delta_ptr, parts_ptr, scale, L, D, DX, c_own, own_start,
            offs, mask, tok, c_base, c_step, q_base, q_step, x_base, x_step, o_base, o_step)
    dq_ptr += first * D
    dk_ptr += first * D
    dx_ptr += first * DX
    offs_x = tl.arange(0, BLOCK_X)
    if ONE_BLOCK:
        dq, dk, dx, gc = _bwd_line_block(q_ptr, k_ptr, x_ptr, c_ptr, do_ptr, lse_ptr, delta_ptr, scale, L, D, DX, offs,
                                         mask, tok, q_base, q_step, x_base, x_step, o_base, o_step, c_base, c_step,
                                         BLOCK_OWN, BLOCK_D, BLOCK_X, PRECISION)
        _write(dq_ptr, tok, mask, offs_d, D, dq, ACC_DQ)
        _write(dk_ptr, tok, mask, offs_d, D, dk, ACC_DK)
        _write(dx_ptr, tok, mask, offs_x, DX, dx, False)
    else:
        gc = tl.zeros_like(c_own)
        if not KEYS or BOTH:
            dq, _, gc = _bwd_role(*args, False, COLUMNS, BLOCK_OWN, BLOCK_OTHER, BLOCK_D, BLOCK_X, PRECISION, RAGGED,
                                  FOLD)
            _write(dq_ptr, tok, mask, offs_d, D, dq * scale, ACC_DQ)
        if KEYS or BOTH:
            dk, dx, gc_k = _bwd_role(*args, True, COLUMNS, BLOCK_OWN, BLOCK_OTHER, BLOCK_D, BLOCK_X, PRECISION,
                                     RAGGED, FOLD and not keys_full(BLOCK_OWN, BLOCK_D, BLOCK_X), VALUES_ONLY)
            gc += gc_k
            if not VALUES_ONLY:
                _write(dk_ptr, tok, mask, offs_d, D, dk * scale, ACC_DK)
            _write(dx_ptr, tok, mask, offs_x, DX, dx, False)
    if not VALUES_ONLY:
        if ACC_GC:
            gc += tl.load(gc_ptr + tok, mask=mask, other=0.0)
        tl.store(gc_ptr + tok, gc, mask=mask)


def folds(q, directions, cap: int, backward: bool = False) -> bool:
    """Whether a pass along any of ``directions`` (columns: True, rows: False) of q's map takes the other tokens'
    terms from the tables' parts (:func:`table_parts_buffer`) in its scores' products: its forward
    (:func:`_forward_folds`), or with ``backward`` its backward's programs (either role)."""
    if q.dtype == torch.float32:  # (at no further cost)
        return False
    for n in (q.shape[2] if columns else q.shape[3] for columns in directions):
        cfg = lp.config('line_fwd', n, q.dtype, cap)
        if _forward_folds(cfg, q.dtype, q.shape[-1], n):
            return True
        if backward:
            cfg = lp.config('line_bwd', n, q.dtype, cap, head_dim=q.shape[-1])
            if _folds(q.dtype, n, min(cfg.block_m, cfg.block_n)):
                return True
    return False


def _forward_folds(cfg: lp.Config, dtype: torch.dtype, d: int, length: int) -> bool:
    """Whether a forward of ``cfg``'s query blocks over lines of ``length`` takes its table in its products: where
    it can (:func:`_folds`), on blocks of 64 queries, or of 32 at head dims up to 16 (at 32, a 32-query loop on sm_80
    is predicted no shorter with the product and its launch slower: docs/kernel_model.md)."""
    return (cfg.block_m >= 64 or d <= 16) and _folds(dtype, length, cfg.block_m)


def _folds(dtype: torch.dtype, length: int, own: int) -> bool:
    """Whether programs of ``own`` tokens can take the other tokens' terms from the tables' parts: half precision
    (the parts are bfloat16) on lines longer than an own block (other blocks before or after it)."""
    return dtype != torch.float32 and length > own


def table_parts_buffer(q) -> torch.Tensor:
    """The buffer of both tables' parts that a pass writes and the passes after it read (:func:`_line_fwd`):
    (B, heads, H, W, 16) bfloat16."""
    return torch.empty(*q.shape[:-1], 16, device=q.device, dtype=torch.bfloat16)


#: the value channels above which the forward on the long row's lines shorter than its block (one block, its keys
#: masked) takes the ISA's 255 registers where its configuration bounds them lower (sm_90's 168: 50-token lines
#: with 64 channels spill 40 B there)
FULL_REGISTERS_X = 32
#: the triton below which the forward's short row (32 x 32 tiles over 2 warps) takes 255 registers where its
#: configuration bounds them lower (sm_90's 168: triton 3.6 spills 20-108 B there at head dim 32; 3.7 none)
SHORT_BOUNDED_FROM = (3, 7)


def forward_launches(q, k, x, c, scale: float, columns: bool, cap: int, residual=None, lse=None, parts=None,
                     other_table=None):
    """The forward's launch and outputs (out: (B, heads, H, W, dx), lse: (B, heads, H, W), float32). q, k: (B,
    heads, H, W, d), k with q's strides; x (B, heads, H, W, dx); channels contiguous; c (B, heads, H, W) float32,
    contiguous. With a ``residual`` r (x's shape, strides and storage), also (out + r) / 2 in r's dtype, as a (B, H,
    W, heads, dx) tensor's view (B, heads, H, W, dx). A given ``lse`` (a pass's over the same q, k, c, scale and
    direction) is read, not computed, and returned. ``parts`` (:func:`table_parts_buffer`, for this ``scale``):
    with ``other_table`` (the other direction's table, as c) the pass writes its tokens' rows there (both tables'
    parts and its lse's; the first pass over the tables); without, it reads its table's parts from there where it
    :func:`folds` (an earlier pass wrote them) and writes its lse's parts there where its backward folds (reads
    them), unless ``lse`` is given."""
    b, heads, hh, ww, d = q.shape
    dx = x.shape[-1]
    key = (q.shape, dx, q.dtype, cap, columns, lp.precision(q.dtype))
    plan = _FWD_PLANS.get(key)
    if plan is None:
        length, n_lines = (hh, ww) if columns else (ww, hh)
        cfg = lp.config('line_fwd', length, q.dtype, cap)
        if cfg.maxnreg < 255 and (cfg.block_m == 64 and length < cfg.block_m and dx > FULL_REGISTERS_X or
                                  cfg.block_m == 32 and lp.triton_version() < SHORT_BOUNDED_FROM):
            cfg = dataclasses.replace(cfg, maxnreg=255)
        back = lp.config('line_bwd', length, q.dtype, cap, head_dim=d)
        plan = _FWD_PLANS[key] = ((lp.cdiv(length, cfg.block_m) * b * heads * n_lines, ), cfg,
                                  _constexprs(cfg, columns, d, dx, q.dtype, length), length, n_lines,
                                  _folds(q.dtype, length, min(back.block_m, back.block_n)))
    grid, cfg, constexprs, length, n_lines, backward_folds = plan
    out = torch.empty(b, heads, hh, ww, dx, device=q.device, dtype=torch.float32)
    given = lse is not None
    if given and (lse.shape != q.shape[:-1] or lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError(f'line attention: a given lse must be a contiguous float32 tensor of shape '
                         f'{tuple(q.shape[:-1])}, as the forward returns it; got {tuple(lse.shape)} {lse.dtype}')
    if parts is not None and (parts.shape != (*q.shape[:-1], 16) or parts.dtype != torch.bfloat16
                              or not parts.is_contiguous()):
        raise ValueError(f'line attention: the tables\' parts must be a contiguous bfloat16 tensor of shape '
                         f'{(*q.shape[:-1], 16)} (table_parts_buffer); got {tuple(parts.shape)} {parts.dtype}')
    if other_table is not None and (parts is None or given or other_table.shape != c.shape
                                    or not other_table.is_contiguous()):
        raise ValueError('line attention: writing the tables\' parts takes a parts buffer, no given lse and the '
                         'other table, shaped and laid out as c')
    lse = lse if given else torch.empty(b, heads, hh, ww, device=q.device, dtype=torch.float32)
    qs, xs = q.stride(), x.stride()
    if residual is None:
        mean, r_off, ms = out, 0, (0, 0, 0, 0)
    else:
        if residual.stride() != x.stride() or residual.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
            raise ValueError('line attention: the residual must be a view of x\'s storage with x\'s strides')
        mean = torch.empty(b, hh, ww, heads, dx, device=q.device, dtype=residual.dtype).permute(0, 3, 1, 2, 4)
        r_off, ms = residual.storage_offset() - x.storage_offset(), mean.stride()
    write = other_table is not None
    launch = lp.Launch(_line_fwd, grid, (q, k, x, c, other_table if write else c, out if parts is None else parts,
                                         out, lse, mean, scale, heads, hh, ww, length, n_lines, d, dx, qs[0], qs[1],
                                         qs[2], qs[3], xs[0], xs[1], xs[2], xs[3], r_off, *ms[:4]),
                       dict(constexprs, MEAN=residual is not None, LSE_GIVEN=given,
                            FOLD=constexprs['FOLD'] and parts is not None and not write, WRITE_TABLES=write,
                            WRITE_LSE=parts is not None and not write and not given and backward_folds),
                       cfg, q.device)
    if residual is None:
        return [launch], out, lse
    return [launch], out, lse, mean


_FWD_PLANS = register_cache('line_forward_launches', 1024)


def ragged(length: int, block: int) -> bool:
    """Whether a line's blocks of ``block`` other tokens after the own block's (the kernels' part AFTER) can reach
    past its end: a line of several blocks, the last partial (a line of one block has no such part)."""
    return length > block and length % block != 0


def _constexprs(cfg: lp.Config, columns: bool, d: int, dx: int, dtype: torch.dtype, length: int) -> dict:
    return dict(COLUMNS=columns, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=lp.pow2(d), BLOCK_X=lp.pow2(dx),
                PRECISION=lp.precision(dtype), RAGGED=ragged(length, cfg.block_n),
                FOLD=_forward_folds(cfg, dtype, d, length))



#: the most float32 registers per thread that a backward program's own-token sums (dk and dx: own x (d + dx)
#: values over its threads) take where both roles share a launch: more, and the kernel of both roles (whose
#: registers exceed the larger role's) spills at the configs' tiles (sm_90, 64 x 64 at head dim 32: 132-468 B)
BOTH_ROLES_SUMS = 24
#: (capability, own block) -> the same bound where it is lower: sm_80's 64-token blocks spill at 24 (head dim 16
#: with 32 value channels, along columns: 272 B)
BOTH_ROLES_SUMS_AT = {(80, 64): 16}


def roles_in_one_launch(cfg: lp.Config, d: int, dx: int, cap: int) -> bool:
    """Whether a backward of ``cfg``'s blocks on capability ``cap`` runs both roles in one launch
    (:func:`_line_bwd`'s BOTH): equal own and other blocks, and own-token sums within :data:`BOTH_ROLES_SUMS`
    registers per thread (:data:`BOTH_ROLES_SUMS_AT` where it bounds them)."""
    most = BOTH_ROLES_SUMS_AT.get((cap, cfg.block_m), BOTH_ROLES_SUMS)
    return cfg.block_m == cfg.block_n and cfg.block_m * (lp.pow2(d) + lp.pow2(dx)) <= most * 32 * cfg.num_warps


def backward_launches(q, k, x, c, out, lse, dout, scale: float, columns: bool, cap: int, dq=None, dk=None, dc=None,
                      parts=None, values_only: bool = False):
    """The backward's launches (one of both roles, or the keys' programs and then the queries': :func:`_line_bwd`)
    and the buffers they fill: dq, dk, dx (float32, shaped as q, k, x, contiguous) and dc (float32, as c). q, k, x,
    c, dout as :func:`forward_launches` takes q, k, x, c; out, lse as it returns them. A given ``dq``, ``dk`` or
    ``dc`` (an earlier pass's, of the same q, k or table) is added to, not replaced. Given the ``parts`` the forward
    passes wrote (both tables' and this pass's lse), the programs take the other tokens' terms from there in the
    scores' products where lines are longer than their own blocks (half precision). With ``values_only`` one launch
    of the keys' programs computes dx = P^T dout alone (VALUES_ONLY; ``out`` unused, x only for its shape and
    strides): the buffers are (None, None, dx, None)."""
    b, heads, hh, ww, d = q.shape
    dx_dim = x.shape[-1]
    length, n_lines = (hh, ww) if columns else (ww, hh)
    f32 = dict(device=q.device, dtype=torch.float32)
    dx = torch.empty(x.shape, **f32)
    acc_q, acc_k, acc_c = dq is not None, dk is not None, dc is not None
    if values_only:  # no score gradient: no delta, and dq, dk, dc are not written (dx in their places)
        delta, dq, dk, dc = lse, dx, dx, dx
    else:
        delta = (dout * out).sum(-1)
        dq = dq if acc_q else torch.empty(q.shape, **f32)
        dk = dk if acc_k else torch.empty(k.shape, **f32)
        dc = dc if acc_c else torch.empty(c.shape, **f32)
    cfg = lp.config('line_bwd', length, q.dtype, cap, head_dim=d)
    qs, xs, os_ = q.stride(), x.stride(), dout.stride()
    args = (scale, heads, hh, ww, length, n_lines, d, dx_dim, qs[0], qs[1], qs[2], qs[3], xs[0],
            xs[1], xs[2], xs[3], os_[0], os_[1], os_[2], os_[3])
    # one launch of both roles (each program the queries' role and then the keys' on its block; on lines of one
    # block whose roles would take two launches, both from one tile of scores) or the keys' programs first (their
    # table part is stored, or added), then the queries' (added to it)
    both = not values_only and roles_in_one_launch(cfg, d, dx_dim, cap)
    one_block = not values_only and cfg.block_m == cfg.block_n and length <= cfg.block_m and not both
    roles = (True, ) if values_only else (None, ) if one_block or both else (True, False)
    launches = []
    for keys in roles:
        own, other = (cfg.block_n, cfg.block_m) if keys else (cfg.block_m, cfg.block_n)
        launches.append(lp.Launch(_line_bwd, (lp.cdiv(length, own) * b * heads * n_lines, ),
                                  (q, k, x, c, dout, lse, delta, dq if parts is None else parts, dq, dk, dx, dc,
                                   *args),
                                  dict(KEYS=bool(keys), BOTH=keys is None and not one_block, COLUMNS=columns,
                                       BLOCK_OWN=own, BLOCK_OTHER=other, BLOCK_D=lp.pow2(d), BLOCK_X=lp.pow2(dx_dim),
                                       PRECISION=lp.precision(q.dtype), RAGGED=ragged(length, other), ACC_DQ=acc_q,
                                       ACC_DK=acc_k, ACC_GC=acc_c if keys is not False else True,
                                       FOLD=parts is not None and _folds(q.dtype, length, own),
                                       ONE_BLOCK=one_block, VALUES_ONLY=values_only), cfg, q.device))
    return launches, (None, None, dx, None) if values_only else (dq, dk, dx, dc)


#: the capabilities where a row backward over both row passes of form 'release' (twice the value channels) may take
#: the keys' programs into :func:`keys_full` tiles: they compile without spills there (on sm_90 32 B spill)
KEYS_FULL_MERGES = (80, )


def merges_row_passes(q, dv: int, cap: int) -> bool:
    """Whether form 'release''s backward on q's map (B, heads, H, W, d), dv value channels, takes both row passes in
    one launch of twice the value channels (the last's values first: :func:`backward_launches`' ``values_only``):
    unless that takes its keys' programs into :func:`keys_full` tiles (32 own tokens at head dim 32, 64 value
    channels), but on KEYS_FULL_MERGES."""
    cfg = lp.config('line_bwd', q.shape[3], q.dtype, cap, head_dim=q.shape[-1])
    d = lp.pow2(q.shape[-1])
    return (cap in KEYS_FULL_MERGES or not keys_full(cfg.block_n, d, lp.pow2(2 * dv))
            or keys_full(cfg.block_n, d, lp.pow2(dv)))


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


#: the eager path of :data:`line_attention_op` (:class:`~mmppma.ops.triton_support.calls.KernelFunction`): out and
#: lse saved, lse not returned
LINE_KERNELS = (_forward_saving_out, _backward, 4)


def line_attention(q, k, x, c, scale: float, columns: bool, caller: Caller, traced: Optional[bool] = None):
    """Masked attention along rows (columns=False) or columns of q, k (B, heads, H, W, d), x (B, heads, H, W, dx)
    with the table c (B, heads, H, W) cumulated along them; ``caller``: what errors name; ``traced``: whether
    torch.compile traces the call (None: ask)."""
    q, k, x = lp.kernel_layout(q, k, x)
    c = c.float().contiguous()
    out = call_kernels(caller, line_attention_op, LINE_KERNELS, _forward, traced, q, k, x, c, float(scale), columns)
    return out.to(x.dtype)
