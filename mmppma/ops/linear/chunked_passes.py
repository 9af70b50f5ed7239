"""The Triton kernels of the chunked form's passes between chunks (V2H; docs/method.md §5) and their launch lists.

Forward (:func:`pass_launches`): a rolling state per column, S[l] = the keys of the chunks already walked decayed
to a corner row, moves from chunk to chunk (:func:`_update`) and reaches each query row of the next chunk
(:func:`_queries`). Backward (:func:`grad_launches`): the same walks carry S and, beside it, U[l] = the queries of
the chunks already walked (their row scans of ``s1 (x) g`` at column l) decayed to the corner (:func:`_update_queries`);
:func:`_grad_queries` takes ds1 and the tables' node gradients of a query row against S, :func:`_grad_keys` ds2,
dv and the key rows' node gradients against U. Cb is monotone along a column, so every column factor is
``exp(-|Cb[a, l] - Cb[b, l]|)`` and the down walk (top to bottom) and the up walk run the same kernels.
"""
from typing import List, Tuple

import torch
import triton
import triton.language as tl

from ..triton_support import launch as lp

Bounds = List[Tuple[int, int]]


@triton.jit
def _decayed_state(state_ptr, cb_row, cb_corner, j, tile, mask_dc, D, C):
    """exp(-|Cb[i, j] - Cb[corner, j]|) S[j]: the state of column j at query row i."""
    decay = tl.exp(-tl.abs(tl.load(cb_row + j) - tl.load(cb_corner + j)))
    return decay * tl.load(state_ptr + j * D * C + tile, mask=mask_dc, other=0.0)


@triton.jit
def _chunk_keys(s2_ptr, v_ptr, cb_ptr, keys, j, cb_i, signs, offs_d, offs_c, mask_r, mask_d, mask_c, D, C,
                SIGNED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """sum_k exp(-|Cb[i, j] - Cb[k, j]|) s2[k, j] (x) v[k, j] over the chunk's rows k (``keys``: their tokens at
    column 0), (BLOCK_D, BLOCK_C); with SIGNED also the same sum with each term times ``signs`` (sign(i - k))."""
    toks = keys + j
    weight = tl.where(mask_r, tl.exp(-tl.abs(cb_i - tl.load(cb_ptr + toks, mask=mask_r, other=0.0))), 0.0)
    s2 = tl.load(s2_ptr + toks[:, None] * D + offs_d[None, :], mask=mask_r[:, None] & mask_d[None, :], other=0.0)
    v = tl.load(v_ptr + toks[:, None] * C + offs_c[None, :], mask=mask_r[:, None] & mask_c[None, :], other=0.0)
    f = tl.dot(tl.trans(s2 * weight[:, None]), v, input_precision=DOT_PRECISION)
    fs = f
    if SIGNED:
        fs = tl.dot(tl.trans(s2 * (weight * signs)[:, None]), v, input_precision=DOT_PRECISION)
    return f, fs


@triton.jit
def _queries(s1_ptr, s2_ptr, v_ptr, ca_ptr, cb_ptr, state_ptr, out_ptr, r0, rows, corner, H, W, D, C,
             HAS_STATE: tl.constexpr, INTRA: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[i, j] += s1[i, j] . sum_l exp(-|Ca[i, j] - Ca[i, l]|) x[l] for the query row i = r0 + program_id(1) of
    the chunk of ``rows`` rows from r0, value channels of block program_id(2), where x[l] takes (HAS_STATE) the
    state at ``corner``, exp(-|Cb[i, l] - Cb[corner, l]|) S[l], and (INTRA) the chunk's own keys,
    sum_k exp(-|Cb[i, l] - Cb[k, l]|) s2[k, l] (x) v[k, l]. s1, s2 (BH, H, W, D), v, out (BH, H, W, C), ca, cb
    (BH, H, W), state (BH, W, D, C), all float32 and contiguous."""
    bh = tl.program_id(0).to(tl.int64)
    row = bh * H + r0 + tl.program_id(1)
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < rows
    mask_d = offs_d < D
    mask_c = offs_c < C
    mask_dc = mask_d[:, None] & mask_c[None, :]
    tile = offs_d[:, None] * C + offs_c[None, :]
    keys = (bh * H + r0 + offs_r) * W
    ca_row = ca_ptr + row * W
    cb_row = cb_ptr + row * W
    cb_corner = cb_ptr + (bh * H + corner) * W
    state_ptr += bh * W * D * C
    s1_ptr += row * W * D
    out_ptr += row * W * C
    for sweep in tl.static_range(2):  # forward: scan[j] = exp(-|Ca[j] - Ca[j - 1]|) scan[j - 1] + x[j]; backward
        scan = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        prev = tl.load(ca_row + (W - 1) * sweep)
        for jj in range(0, W):
            j = jj + sweep * (W - 1 - 2 * jj)
            ca = tl.load(ca_row + j)
            x = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
            if HAS_STATE:
                x += _decayed_state(state_ptr, cb_row, cb_corner, j, tile, mask_dc, D, C)
            if INTRA:
                x += _chunk_keys(s2_ptr, v_ptr, cb_ptr, keys, j, tl.load(cb_row + j), offs_r, offs_d, offs_c, mask_r,
                                 mask_d, mask_c, D, C, False, DOT_PRECISION)[0]
            scan = tl.exp(-tl.abs(ca - prev)) * scan + x
            prev = ca
            s1 = tl.load(s1_ptr + j * D + offs_d, mask=mask_d, other=0.0)
            at = out_ptr + j * C + offs_c
            # the backward sweep leaves out x[j] itself: the forward one counted it
            tl.store(at, tl.load(at, mask=mask_c, other=0.0) + tl.sum(s1[:, None] * (scan - sweep * x), 0),
                     mask=mask_c)


@triton.jit
def _update(s2_ptr, v_ptr, cb_ptr, state_ptr, k0, rows, corner, old, H, W, D, C, FRESH: tl.constexpr,
            DOT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """S[l] <- exp(-|Cb[corner, l] - Cb[old, l]|) S[l] (nothing when FRESH) + sum_k exp(-|Cb[corner, l] - Cb[k, l]|)
    s2[k, l] (x) v[k, l] over the ``rows`` rows k from k0, for column l = program_id(1) and the value channels of
    block program_id(2). s2 (BH, H, W, D), v (BH, H, W, C), cb (BH, H, W), state (BH, W, D, C), float32."""
    bh = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1)
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < rows
    toks = (bh * H + k0 + offs_r) * W + col
    cb_new = tl.load(cb_ptr + (bh * H + corner) * W + col)
    cb_key = tl.load(cb_ptr + toks, mask=mask_r, other=0.0)
    weight = tl.where(mask_r, tl.exp(-tl.abs(cb_new - cb_key)), 0.0)
    s2 = tl.load(s2_ptr + toks[:, None] * D + offs_d[None, :], mask=mask_r[:, None] & (offs_d[None, :] < D), other=0.0)
    v = tl.load(v_ptr + toks[:, None] * C + offs_c[None, :], mask=mask_r[:, None] & (offs_c[None, :] < C), other=0.0)
    acc = tl.dot(tl.trans(s2 * weight[:, None]), v, input_precision=DOT_PRECISION)
    mask_dc = (offs_d[:, None] < D) & (offs_c[None, :] < C)
    at = state_ptr + (bh * W + col) * D * C + offs_d[:, None] * C + offs_c[None, :]
    if not FRESH:
        cb_old = tl.load(cb_ptr + (bh * H + old) * W + col)
        acc += tl.exp(-tl.abs(cb_new - cb_old)) * tl.load(at, mask=mask_dc, other=0.0)
    tl.store(at, acc, mask=mask_dc)


@triton.jit
def _grad_queries(s1_ptr, s2_ptr, v_ptr, g_ptr, ca_ptr, cb_ptr, state_ptr, qbuf_ptr, ds1_ptr, node_ptr, r0, rows,
                  corner, sign, QROWS, BH, H, W, D, C, HAS_STATE: tl.constexpr, INTRA: tl.constexpr,
                  KEEP_Q: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    """Query row i = r0 + program_id(1) of the chunk of ``rows`` rows from r0, value channels of block b =
    program_id(2), against the keys x[l] of :func:`_queries` (HAS_STATE: the state at ``corner``, from keys on the
    side ``sign`` of the query: +1 above, -1 below; INTRA: the chunk's own). With P[j] = s1[i, j] (x) g[i, j], and
    HL, HR (QL, QR) the row scans of x (of P) strictly left and right of j,

    - ds1[b, i, j] += (HL + x + HR)[j] g[j] (this block's channels of g),
    - node[b, sweep, 0, i, j] += <P, HL - HR>[j] + <x, QL - QR>[j]: Ca's node gradient, query and corner column,
    - node[b, sweep, 1, i, j] += <xs, QL + P + QR>[j]: Cb's, the query row as the corner, where xs is x with each
      key's term times sign(i - k),
    - qbuf[i - r0, j] = (QL + P + QR)[j] (KEEP_Q): the row's queries at column j, for :func:`_grad_keys` and
      :func:`_update_queries`.

    The forward sweep adds to node slot ``sweep`` 0, the backward one to 1 (no value stored and read back by one
    program). s1, s2 (BH, H, W, D), v, g (BH, H, W, C), ca, cb (BH, H, W), state (BH, W, D, C), qbuf (BH, QROWS,
    W, D, C), ds1 (blocks, BH, H, W, D), node (blocks, 2, 2, BH, H, W), float32."""
    bh = tl.program_id(0).to(tl.int64)
    rr = tl.program_id(1)
    blk = tl.program_id(2).to(tl.int64)
    row = bh * H + r0 + rr
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = blk * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < rows
    mask_d = offs_d < D
    mask_c = offs_c < C
    mask_dc = mask_d[:, None] & mask_c[None, :]
    tile = offs_d[:, None] * C + offs_c[None, :]
    keys = (bh * H + r0 + offs_r) * W
    signs = tl.where(offs_r < rr, 1.0, tl.where(offs_r > rr, -1.0, 0.0))
    ca_row = ca_ptr + row * W
    cb_row = cb_ptr + row * W
    cb_corner = cb_ptr + (bh * H + corner) * W
    state_ptr += bh * W * D * C
    s1_ptr += row * W * D
    g_ptr += row * W * C
    tokens = BH * H * W
    ds1_ptr += (blk * tokens + row * W) * D
    qbuf_ptr += (bh * QROWS + rr) * W * D * C
    for sweep in tl.static_range(2):
        # forward sweep: h, q = HL, QL strictly left of j, then j added; backward: HR, QR strictly right
        h = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        q = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        node_a = node_ptr + (blk * 4 + sweep * 2) * tokens + row * W  # Ca's slot; + tokens: Cb's
        prev = tl.load(ca_row + (W - 1) * sweep)
        for jj in range(0, W):
            j = jj + sweep * (W - 1 - 2 * jj)
            ca = tl.load(ca_row + j)
            a = tl.exp(-tl.abs(ca - prev))
            prev = ca
            g = tl.load(g_ptr + j * C + offs_c, mask=mask_c, other=0.0)
            p = tl.load(s1_ptr + j * D + offs_d, mask=mask_d, other=0.0)[:, None] * g[None, :]
            q = a * q
            if HAS_STATE or INTRA:
                h = a * h
                x = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
                xs = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
                if HAS_STATE:
                    state = _decayed_state(state_ptr, cb_row, cb_corner, j, tile, mask_dc, D, C)
                    x += state
                    xs += sign * state
                if INTRA:
                    own, own_signed = _chunk_keys(s2_ptr, v_ptr, cb_ptr, keys, j, tl.load(cb_row + j), signs, offs_d,
                                                  offs_c, mask_r, mask_d, mask_c, D, C, True, DOT_PRECISION)
                    x += own
                    xs += own_signed
                at = node_a + j
                side = 1.0 - 2.0 * sweep  # left of j: +, right: -
                tl.store(at, tl.load(at) + side * tl.sum(tl.sum(p * h + x * q, 1), 0))
                at += tokens
                tl.store(at, tl.load(at) + tl.sum(tl.sum(xs * (q + p * (1 - sweep)), 1), 0))
                at = ds1_ptr + j * D + offs_d
                tl.store(at, tl.load(at, mask=mask_d, other=0.0) + tl.sum((h + x * (1 - sweep)) * g[None, :], 1),
                         mask=mask_d)
                h += x
            if KEEP_Q:
                at = qbuf_ptr + j * D * C + tile
                if sweep == 0:
                    tl.store(at, q + p, mask=mask_dc)
                else:
                    tl.store(at, tl.load(at, mask=mask_dc, other=0.0) + q, mask=mask_dc)
            q += p


@triton.jit
def _grad_keys(s2_ptr, v_ptr, cb_ptr, u_ptr, qbuf_ptr, ds2_ptr, dv_ptr, node_ptr, k0, rows, corner, sign, QROWS, BH,
               H, W, D, C, HAS_STATE: tl.constexpr, INTRA: tl.constexpr, DOT_PRECISION: tl.constexpr,
               BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """The keys of the chunk of ``rows`` rows k from k0 in column l = program_id(1), value channels of block b =
    program_id(2), against the queries Y[k] that reach them: (HAS_STATE) those U holds at ``corner``,
    exp(-|Cb[corner, l] - Cb[k, l]|) U[l], from the side ``sign`` of the keys (+1 above, -1 below), and (INTRA) the
    chunk's own rows i, sum_i exp(-|Cb[i, l] - Cb[k, l]|) qbuf[i - k0, l]: dv[k] += Y[k]^T s2[k] (this block's
    channels), ds2[b, k] += Y[k] v[k] and node[b, 0, 1, k] += s2[k] . Ys[k] v[k] (Cb's node gradient, the key
    row), Ys the sum with each query's term times sign(k - i). s2 (BH, H, W, D), v, dv (BH, H, W, C), u (BH, W, D,
    C), qbuf (BH, QROWS, W, D, C), ds2 (blocks, BH, H, W, D), node (blocks, 2, 2, BH, H, W), float32."""
    bh = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1)
    blk = tl.program_id(2).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = blk * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < rows
    mask_d = offs_d < D
    mask_c = offs_c < C
    mask_rd = mask_r[:, None] & mask_d[None, :]
    mask_rc = mask_r[:, None] & mask_c[None, :]
    mask_dc = mask_d[:, None] & mask_c[None, :]
    tile = offs_d[:, None] * C + offs_c[None, :]
    cb_col = cb_ptr + bh * H * W + col
    toks = (bh * H + k0 + offs_r) * W + col
    cb_keys = tl.load(cb_ptr + toks, mask=mask_r, other=0.0)
    s2 = tl.load(s2_ptr + toks[:, None] * D + offs_d[None, :], mask=mask_rd, other=0.0)
    v = tl.load(v_ptr + toks[:, None] * C + offs_c[None, :], mask=mask_rc, other=0.0)
    ys2 = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)  # the rows' Y^T s2
    yv = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)  # the rows' Y v
    node = tl.zeros([BLOCK_R], tl.float32)
    if HAS_STATE:
        weight = tl.where(mask_r, tl.exp(-tl.abs(tl.load(cb_col + corner * W) - cb_keys)), 0.0)
        u = tl.load(u_ptr + (bh * W + col) * D * C + tile, mask=mask_dc, other=0.0)
        t = tl.dot(s2, u, input_precision=DOT_PRECISION) * weight[:, None]
        ys2 += t
        yv += tl.dot(v, tl.trans(u), input_precision=DOT_PRECISION) * weight[:, None]
        node += sign * tl.sum(t * v, 1)
    if INTRA:
        qbuf_ptr += (bh * QROWS * W + col) * D * C
        for i in range(0, rows):
            weight = tl.where(mask_r, tl.exp(-tl.abs(tl.load(cb_col + (k0 + i) * W) - cb_keys)), 0.0)
            q = tl.load(qbuf_ptr + i * W * D * C + tile, mask=mask_dc, other=0.0)
            t = tl.dot(s2, q, input_precision=DOT_PRECISION) * weight[:, None]
            ys2 += t
            yv += tl.dot(v, tl.trans(q), input_precision=DOT_PRECISION) * weight[:, None]
            node += tl.where(offs_r > i, 1.0, tl.where(offs_r < i, -1.0, 0.0)) * tl.sum(t * v, 1)
    at = dv_ptr + toks[:, None] * C + offs_c[None, :]
    tl.store(at, tl.load(at, mask=mask_rc, other=0.0) + ys2, mask=mask_rc)
    tokens = BH * H * W
    at = ds2_ptr + (blk * tokens + toks[:, None]) * D + offs_d[None, :]
    tl.store(at, tl.load(at, mask=mask_rd, other=0.0) + yv, mask=mask_rd)
    at = node_ptr + blk * 4 * tokens + tokens + toks
    tl.store(at, tl.load(at, mask=mask_r, other=0.0) + node, mask=mask_r)


@triton.jit
def _update_queries(qbuf_ptr, cb_ptr, u_ptr, k0, rows, corner, old, QROWS, H, W, D, C, FRESH: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """U[l] <- exp(-|Cb[corner, l] - Cb[old, l]|) U[l] (nothing when FRESH) + sum_k exp(-|Cb[corner, l] - Cb[k, l]|)
    qbuf[k - k0, l] over the ``rows`` rows k from k0, for column l = program_id(1) and the value channels of block
    program_id(2). qbuf (BH, QROWS, W, D, C), cb (BH, H, W), u (BH, W, D, C), float32."""
    bh = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_dc = (offs_d[:, None] < D) & (offs_c[None, :] < C)
    tile = offs_d[:, None] * C + offs_c[None, :]
    cb_col = cb_ptr + bh * H * W + col
    cb_new = tl.load(cb_col + corner * W)
    at = u_ptr + (bh * W + col) * D * C + tile
    acc = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
    if not FRESH:
        acc = tl.exp(-tl.abs(cb_new - tl.load(cb_col + old * W))) * tl.load(at, mask=mask_dc, other=0.0)
    qbuf_ptr += (bh * QROWS * W + col) * D * C
    for r in range(0, rows):
        weight = tl.exp(-tl.abs(cb_new - tl.load(cb_col + (k0 + r) * W)))
        acc += weight * tl.load(qbuf_ptr + r * W * D * C + tile, mask=mask_dc, other=0.0)
    tl.store(at, acc, mask=mask_dc)


def config(cap: int) -> lp.Config:
    """The passes' launch configuration: the interpreter's, else 4 warps and one stage (no table row of its own:
    tools/check_kernels.py compiles these kernels for spills but does not model them)."""
    return lp.Config(32, 32, 1 if cap == 0 else 4, 1, family='ppmla_chunk')


def block_c(c: int) -> int:
    """The value channels of a program."""
    return min(lp.pow2(c), 32)


def pass_launches(s1, s2, v, ca, cb, out, state, bounds: Bounds, cap: int) -> List[lp.Launch]:
    """The forward's launches over the chunks ``bounds`` (top to bottom), adding V2H's product to ``out``: the down
    walk (each chunk's own keys and the state of those above it), then the up walk (the state of those below).
    s1, s2 (BH, H, W, d), v and out (BH, H, W, c), ca, cb (BH, H, W), state (BH, W, d, c) scratch; float32,
    contiguous."""
    bh, h, w, d = s1.shape
    c = v.shape[-1]
    cfg = config(cap)
    blocks = dict(BLOCK_D=lp.pow2(d), BLOCK_C=block_c(c))
    cblocks = lp.cdiv(c, blocks['BLOCK_C'])
    precision = lp.precision(torch.float32)
    launches = []

    def visit(r0, r1, corner, n, last, down):
        if down or corner is not None:
            launches.append(lp.Launch(_queries, (bh, r1 - r0, cblocks), (
                s1, s2, v, ca, cb, state, out, r0, r1 - r0, corner or 0, h, w, d, c),
                dict(HAS_STATE=corner is not None, INTRA=down, DOT_PRECISION=precision, BLOCK_R=lp.pow2(r1 - r0),
                     **blocks), cfg, s1.device))

    def move(r0, r1, corner, old, fresh):
        launches.append(_state_update(s2, v, cb, state, r0, r1, corner, old, fresh, cfg))

    _walks(bounds, visit, move)
    return launches


def _state_update(s2, v, cb, state, r0, r1, corner, old, fresh, cfg) -> lp.Launch:
    """The :func:`_update` launch moving S from row ``old`` to ``corner`` and adding the rows [r0, r1)."""
    bh, h, w, d = s2.shape
    c = v.shape[-1]
    return lp.Launch(_update, (bh, w, lp.cdiv(c, block_c(c))), (s2, v, cb, state, r0, r1 - r0, corner, old, h, w, d, c),
                     dict(FRESH=fresh, DOT_PRECISION=lp.precision(torch.float32), BLOCK_R=lp.pow2(r1 - r0),
                          BLOCK_D=lp.pow2(d), BLOCK_C=block_c(c)), cfg, s2.device)


def _walks(bounds: Bounds, visit, move) -> None:
    """The down walk then the up walk over the chunks ``bounds``: ``visit(r0, r1, corner, n, last, down)`` where
    chunk n meets what the states hold at ``corner`` (None for the walk's first chunk: nothing yet), then
    ``move(r0, r1, corner, old, fresh)`` where the states move on from ``old`` to ``corner`` and take the chunk
    (every chunk but the walk's last)."""
    last = len(bounds) - 1
    for n, (r0, r1) in enumerate(bounds):  # down: corner r0 - 1, then the state moves to r1 - 1
        visit(r0, r1, r0 - 1 if n else None, n, last, True)
        if n < last:
            move(r0, r1, r1 - 1, r0 - 1, n == 0)
    for n in range(last, -1, -1):  # up: corner r1 - 1, then the state moves to r0 - 1
        r0, r1 = bounds[n]
        visit(r0, r1, r1 - 1 if n < last else None, n, last, False)
        if n:
            move(r0, r1, r0 - 1, r1 - 1, n == last)


def grad_launches(g, s1, s2, v, ca, cb, state, u, qbuf, ds1, ds2, dv, node, bounds: Bounds,
                  cap: int) -> List[lp.Launch]:
    """The backward's launches over the chunks ``bounds`` (top to bottom), the down walk (the pairs inside each chunk
    and those with the keys above) then the up walk: ds1 and ds2 (per value-channel block: (blocks, BH, H, W, d)),
    dv (BH, H, W, c) and the node gradients of the tables (blocks, 2 sweeps, (Ca, Cb), BH, H, W), all added to.
    g, v (BH, H, W, c), s1, s2 (BH, H, W, d), ca, cb (BH, H, W); state, u (BH, W, d, c) and qbuf (BH, R, W, d, c)
    scratch; float32, contiguous."""
    bh, h, w, d = s1.shape
    c = v.shape[-1]
    cfg = config(cap)
    blocks = dict(BLOCK_D=lp.pow2(d), BLOCK_C=block_c(c), DOT_PRECISION=lp.precision(torch.float32))
    cblocks = lp.cdiv(c, blocks['BLOCK_C'])
    qrows = qbuf.shape[1]
    launches = []

    def visit(r0, r1, corner, n, last, down):
        state_ = corner is not None
        keep = down or n > 0  # the chunk's queries for its own keys (down) or for the state U (up: not the last)
        if not (down or state_ or keep):
            return
        sign = 1.0 if down else -1.0
        flags = dict(HAS_STATE=state_, INTRA=down, BLOCK_R=lp.pow2(r1 - r0), **blocks)
        launches.append(lp.Launch(_grad_queries, (bh, r1 - r0, cblocks), (
            s1, s2, v, g, ca, cb, state, qbuf, ds1, node, r0, r1 - r0, corner or 0, sign, qrows, bh, h, w, d, c),
            dict(KEEP_Q=keep, **flags), cfg, s1.device))
        if down or state_:
            launches.append(lp.Launch(_grad_keys, (bh, w, cblocks), (
                s2, v, cb, u, qbuf, ds2, dv, node, r0, r1 - r0, corner or 0, sign, qrows, bh, h, w, d, c),
                flags, cfg, s1.device))

    def move(r0, r1, corner, old, fresh):
        launches.append(_state_update(s2, v, cb, state, r0, r1, corner, old, fresh, cfg))
        launches.append(lp.Launch(_update_queries, (bh, w, cblocks), (
            qbuf, cb, u, r0, r1 - r0, corner, old, qrows, h, w, d, c),
            dict(FRESH=fresh, BLOCK_D=blocks['BLOCK_D'], BLOCK_C=blocks['BLOCK_C']), cfg, s1.device))

    _walks(bounds, visit, move)
    return launches
