"""The Triton kernels of the chunked form (V2H; docs/method.md §5) and their launch lists.

Forward (:func:`pass_launches`): a query row of a chunk sweeps its row (:func:`_queries`) against its chunk's own
keys and a rolling state per column, S[l] = the keys of the chunks already walked decayed to a corner row, which
moves from chunk to chunk (:func:`_update`). Backward (:func:`grad_launches`): the same walks carry S and, beside it,
U[l] = the queries of the chunks already walked (their row scans of ``s1 (x) g`` at column l) decayed to the corner
(:func:`_update_queries`); :func:`_grad_queries` takes ds1 and the tables' node gradients of a query row against its
chunk's keys and S, :func:`_grad_keys` ds2, dv and the key rows' node gradients against its chunk's queries and U.
Cb is monotone along a column, so every column factor is ``exp(-|Cb[a, l] - Cb[b, l]|)`` and the down walk (top to
bottom) and the up walk run the same kernels.
"""
from typing import List, NamedTuple, Tuple

import torch
import triton
import triton.language as tl

from ..triton_support import launch as lp

Bounds = List[Tuple[int, int]]


@triton.jit
def _load(ptr, mask):
    """float32 of any float input."""
    return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _decayed_state(state_ptr, cb_row, cb_corner, j, CS, tile, mask_dc, D, C):
    """exp(-|Cb[i, j] - Cb[corner, j]|) S[j]: the state of column j at query row i."""
    decay = tl.exp(-tl.abs(tl.load(cb_row + j * CS) - tl.load(cb_corner + j * CS)))
    return decay * tl.load(state_ptr + j * D * C + tile, mask=mask_dc, other=0.0)


@triton.jit
def _chunk_keys(s2_ptr, v_ptr, cb_ptr, keys, j, CS, cb_i, signs, offs_d, offs_c, mask_r, mask_d, mask_c, D, C,
                SIGNED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """sum_k exp(-|Cb[i, j] - Cb[k, j]|) s2[k, j] (x) v[k, j] over the chunk's rows k (``keys``: their tokens at
    column 0), (BLOCK_D, BLOCK_C); with SIGNED also the same sum with each term times ``signs`` (sign(i - k))."""
    toks = keys + j * CS
    weight = tl.where(mask_r, tl.exp(-tl.abs(cb_i - tl.load(cb_ptr + toks, mask=mask_r, other=0.0))), 0.0)
    s2 = _load(s2_ptr + toks[:, None] * D + offs_d[None, :], mask_r[:, None] & mask_d[None, :])
    v = _load(v_ptr + toks[:, None] * C + offs_c[None, :], mask_r[:, None] & mask_c[None, :])
    f = tl.dot(tl.trans(s2 * weight[:, None]), v, input_precision=DOT_PRECISION)
    fs = f
    if SIGNED:
        fs = tl.dot(tl.trans(s2 * (weight * signs)[:, None]), v, input_precision=DOT_PRECISION)
    return f, fs


@triton.jit(do_not_specialize=['r0', 'rows', 'corner'])  # the chunk's rows: one compile for every chunk
def _queries(s1_ptr, s2_ptr, v_ptr, ca_ptr, cb_ptr, state_ptr, out_ptr, r0, rows, corner, NTOK, RS, CS, W, D, C,
             HAS_STATE: tl.constexpr, INTRA: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[i, j] += s1[i, j] . sum_l exp(-|Ca[i, j] - Ca[i, l]|) x[l] for the query row i = r0 + program_id(1) of
    the chunk of ``rows`` rows from r0, value channels of block program_id(2), where x[l] takes (HAS_STATE) the
    state at ``corner``, exp(-|Cb[i, l] - Cb[corner, l]|) S[l], and (INTRA) the chunk's own keys,
    sum_k exp(-|Cb[i, l] - Cb[k, l]|) s2[k, l] (x) v[k, l]. Token (i, j) of image and head b is b NTOK + i RS +
    j CS in s1, s2 (.., D), v, out (.., C) and the tables ca, cb; W the map's row length; state (BH, W, D, C).
    Inputs of any float dtype, the rest float32."""
    bh = tl.program_id(0).to(tl.int64)
    base = bh * NTOK
    row = base + (r0 + tl.program_id(1)) * RS
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < rows
    mask_d = offs_d < D
    mask_c = offs_c < C
    mask_dc = mask_d[:, None] & mask_c[None, :]
    tile = offs_d[:, None] * C + offs_c[None, :]
    keys = base + (r0 + offs_r) * RS
    ca_row = ca_ptr + row
    cb_row = cb_ptr + row
    cb_corner = cb_ptr + base + corner * RS
    state_ptr += bh * W * D * C
    s1_ptr += row * D
    out_ptr += row * C
    for sweep in tl.static_range(2):  # forward: scan[j] = exp(-|Ca[j] - Ca[j - 1]|) scan[j - 1] + x[j]; backward
        if sweep == 1:  # the forward sweep's outputs, stored by other threads, read back
            tl.debug_barrier()
        scan = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        prev = tl.load(ca_row + (W - 1) * sweep * CS)
        for jj in range(0, W):
            j = jj + sweep * (W - 1 - 2 * jj)
            ca = tl.load(ca_row + j * CS)
            x = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
            if HAS_STATE:
                x += _decayed_state(state_ptr, cb_row, cb_corner, j, CS, tile, mask_dc, D, C)
            if INTRA:
                x += _chunk_keys(s2_ptr, v_ptr, cb_ptr, keys, j, CS, tl.load(cb_row + j * CS), offs_r, offs_d, offs_c,
                                 mask_r, mask_d, mask_c, D, C, False, DOT_PRECISION)[0]
            scan = tl.exp(-tl.abs(ca - prev)) * scan + x
            prev = ca
            s1 = _load(s1_ptr + j * CS * D + offs_d, mask_d)
            at = out_ptr + j * CS * C + offs_c
            # the backward sweep leaves out x[j] itself: the forward one counted it
            tl.store(at, tl.load(at, mask=mask_c, other=0.0) + tl.sum(s1[:, None] * (scan - sweep * x), 0),
                     mask=mask_c)


@triton.jit(do_not_specialize=['k0', 'rows', 'corner', 'old'])  # the chunk's rows: one compile for every chunk
def _update(s2_ptr, v_ptr, cb_ptr, state_ptr, k0, rows, corner, old, NTOK, RS, CS, W, D, C, FRESH: tl.constexpr,
            DOT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """S[l] <- exp(-|Cb[corner, l] - Cb[old, l]|) S[l] (nothing when FRESH) + sum_k exp(-|Cb[corner, l] - Cb[k, l]|)
    s2[k, l] (x) v[k, l] over the ``rows`` rows k from k0, for column l = program_id(1) and the value channels of
    block program_id(2). Tokens as :func:`_queries` has them; state (BH, W, D, C) float32."""
    bh = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1)
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < rows
    cb_col = cb_ptr + bh * NTOK + col * CS
    toks = bh * NTOK + (k0 + offs_r) * RS + col * CS
    cb_new = tl.load(cb_col + corner * RS)
    weight = tl.where(mask_r, tl.exp(-tl.abs(cb_new - tl.load(cb_ptr + toks, mask=mask_r, other=0.0))), 0.0)
    s2 = _load(s2_ptr + toks[:, None] * D + offs_d[None, :], mask_r[:, None] & (offs_d[None, :] < D))
    v = _load(v_ptr + toks[:, None] * C + offs_c[None, :], mask_r[:, None] & (offs_c[None, :] < C))
    acc = tl.dot(tl.trans(s2 * weight[:, None]), v, input_precision=DOT_PRECISION)
    mask_dc = (offs_d[:, None] < D) & (offs_c[None, :] < C)
    at = state_ptr + (bh * W + col) * D * C + offs_d[:, None] * C + offs_c[None, :]
    if not FRESH:
        acc += tl.exp(-tl.abs(cb_new - tl.load(cb_col + old * RS))) * tl.load(at, mask=mask_dc, other=0.0)
    tl.store(at, acc, mask=mask_dc)


@triton.jit(do_not_specialize=['r0', 'rows', 'corner'])  # the chunk's rows: one compile for every chunk
def _grad_queries(s1_ptr, s2_ptr, v_ptr, g_ptr, ca_ptr, cb_ptr, state_ptr, qbuf_ptr, ds1_ptr, node_ptr, r0, rows,
                  corner, sign, QROWS, TOKENS, NTOK, RS, CS, W, D, C, NODE_A, NODE_B, HAS_STATE: tl.constexpr,
                  INTRA: tl.constexpr, KEEP_Q: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """Query row i = r0 + program_id(1) of the chunk of ``rows`` rows from r0, value channels of block b =
    program_id(2), against the keys x[l] of :func:`_queries` (HAS_STATE: the state at ``corner``, from keys on the
    side ``sign`` of the query: +1 above, -1 below; INTRA: the chunk's own). With P[j] = s1[i, j] (x) g[i, j], and
    HL, HR (QL, QR) the row scans of x (of P) strictly left and right of j,

    - ds1[b, i, j] += (HL + x + HR)[j] g[j] (this block's channels of g),
    - node A += <P, HL - HR>[j] + <x, QL - QR>[j]: Ca's node gradient, query and corner column,
    - node B += <xs, QL + P + QR>[j]: Cb's, the query row as the corner, where xs is x with each key's term times
      sign(i - k),
    - qbuf[i - r0, j] = (QL + P + QR)[j] (KEEP_Q): the row's queries at column j, for :func:`_grad_keys` and
      :func:`_update_queries`.

    node (blocks, 2 sweeps, 2, TOKENS): the forward sweep adds to sweep 0, the backward one to 1; A and B at offsets
    NODE_A and NODE_B of a sweep's slot. Tokens as
    :func:`_queries` has them; s1, s2, v, g of any float dtype; state (BH, W, D, C), qbuf (BH, QROWS, W, D, C),
    ds1 (blocks, TOKENS, D), float32."""
    bh = tl.program_id(0).to(tl.int64)
    rr = tl.program_id(1)
    blk = tl.program_id(2).to(tl.int64)
    base = bh * NTOK
    row = base + (r0 + rr) * RS
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = blk * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_r = offs_r < rows
    mask_d = offs_d < D
    mask_c = offs_c < C
    mask_dc = mask_d[:, None] & mask_c[None, :]
    tile = offs_d[:, None] * C + offs_c[None, :]
    keys = base + (r0 + offs_r) * RS
    signs = tl.where(offs_r < rr, 1.0, tl.where(offs_r > rr, -1.0, 0.0))
    ca_row = ca_ptr + row
    cb_row = cb_ptr + row
    cb_corner = cb_ptr + base + corner * RS
    state_ptr += bh * W * D * C
    s1_ptr += row * D
    g_ptr += row * C
    tokens = TOKENS  # B heads NTOK
    ds1_ptr += (blk * tokens + row) * D
    qbuf_ptr += (bh * QROWS + rr) * W * D * C
    for sweep in tl.static_range(2):
        # forward sweep: h, q = HL, QL strictly left of j, then j added; backward: HR, QR strictly right
        if sweep == 1:  # the forward sweep's ds1 and qbuf, stored by other threads, read back
            tl.debug_barrier()
        h = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        q = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
        node = node_ptr + (blk * 4 + sweep * 2) * tokens + row
        prev = tl.load(ca_row + (W - 1) * sweep * CS)
        for jj in range(0, W):
            j = jj + sweep * (W - 1 - 2 * jj)
            ca = tl.load(ca_row + j * CS)
            a = tl.exp(-tl.abs(ca - prev))
            prev = ca
            g = _load(g_ptr + j * CS * C + offs_c, mask_c)
            p = _load(s1_ptr + j * CS * D + offs_d, mask_d)[:, None] * g[None, :]
            q = a * q
            if HAS_STATE or INTRA:
                h = a * h
                x = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
                xs = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
                if HAS_STATE:
                    state = _decayed_state(state_ptr, cb_row, cb_corner, j, CS, tile, mask_dc, D, C)
                    x += state
                    xs += sign * state
                if INTRA:
                    own, own_signed = _chunk_keys(s2_ptr, v_ptr, cb_ptr, keys, j, CS, tl.load(cb_row + j * CS), signs,
                                                  offs_d, offs_c, mask_r, mask_d, mask_c, D, C, True, DOT_PRECISION)
                    x += own
                    xs += own_signed
                at = node + NODE_A + j * CS
                side = 1.0 - 2.0 * sweep  # left of j: +, right: -
                tl.store(at, tl.load(at) + side * tl.sum(tl.sum(p * h + x * q, 1), 0))
                at = node + NODE_B + j * CS
                tl.store(at, tl.load(at) + tl.sum(tl.sum(xs * (q + p * (1 - sweep)), 1), 0))
                at = ds1_ptr + j * CS * D + offs_d
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


@triton.jit(do_not_specialize=['k0', 'rows', 'corner'])  # the chunk's rows: one compile for every chunk
def _grad_keys(s2_ptr, v_ptr, cb_ptr, u_ptr, qbuf_ptr, ds2_ptr, dv_ptr, node_ptr, k0, rows, corner, sign, QROWS,
               TOKENS, NTOK, RS, CS, W, D, C, NODE_B, HAS_STATE: tl.constexpr, INTRA: tl.constexpr,
               DOT_PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """The keys of the chunk of ``rows`` rows k from k0 in column l = program_id(1), value channels of block b =
    program_id(2), against the queries Y[k] that reach them: (HAS_STATE) those U holds at ``corner``,
    exp(-|Cb[corner, l] - Cb[k, l]|) U[l], from the side ``sign`` of the keys (+1 above, -1 below), and (INTRA) the
    chunk's own rows i, sum_i exp(-|Cb[i, l] - Cb[k, l]|) qbuf[i - k0, l]: dv[k] += Y[k]^T s2[k] (this block's
    channels), ds2[b, k] += Y[k] v[k] and node B (sweep 0) += s2[k] . Ys[k] v[k] (Cb's node gradient, the key
    row), Ys the sum with each query's term times sign(k - i). Tokens as :func:`_queries` has them; s2, v of any
    float dtype; dv (TOKENS, C), u (BH, W, D, C), qbuf (BH, QROWS, W, D, C), ds2 (blocks, TOKENS, D), node
    as :func:`_grad_queries` has it, float32."""
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
    cb_col = cb_ptr + bh * NTOK + col * CS
    toks = bh * NTOK + (k0 + offs_r) * RS + col * CS
    cb_keys = tl.load(cb_ptr + toks, mask=mask_r, other=0.0)
    s2 = _load(s2_ptr + toks[:, None] * D + offs_d[None, :], mask_rd)
    v = _load(v_ptr + toks[:, None] * C + offs_c[None, :], mask_rc)
    ys2 = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)  # the rows' Y^T s2
    yv = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)  # the rows' Y v
    node = tl.zeros([BLOCK_R], tl.float32)
    if HAS_STATE:
        weight = tl.where(mask_r, tl.exp(-tl.abs(tl.load(cb_col + corner * RS) - cb_keys)), 0.0)
        u = tl.load(u_ptr + (bh * W + col) * D * C + tile, mask=mask_dc, other=0.0)
        t = tl.dot(s2, u, input_precision=DOT_PRECISION) * weight[:, None]
        ys2 += t
        yv += tl.dot(v, tl.trans(u), input_precision=DOT_PRECISION) * weight[:, None]
        node += sign * tl.sum(t * v, 1)
    if INTRA:
        qbuf_ptr += (bh * QROWS * W + col) * D * C
        for i in range(0, rows):
            weight = tl.where(mask_r, tl.exp(-tl.abs(tl.load(cb_col + (k0 + i) * RS) - cb_keys)), 0.0)
            q = tl.load(qbuf_ptr + i * W * D * C + tile, mask=mask_dc, other=0.0)
            t = tl.dot(s2, q, input_precision=DOT_PRECISION) * weight[:, None]
            ys2 += t
            yv += tl.dot(v, tl.trans(q), input_precision=DOT_PRECISION) * weight[:, None]
            node += tl.where(offs_r > i, 1.0, tl.where(offs_r < i, -1.0, 0.0)) * tl.sum(t * v, 1)
    at = dv_ptr + toks[:, None] * C + offs_c[None, :]
    tl.store(at, tl.load(at, mask=mask_rc, other=0.0) + ys2, mask=mask_rc)
    tokens = TOKENS  # B heads NTOK
    at = ds2_ptr + (blk * tokens + toks[:, None]) * D + offs_d[None, :]
    tl.store(at, tl.load(at, mask=mask_rd, other=0.0) + yv, mask=mask_rd)
    at = node_ptr + blk * 4 * tokens + NODE_B + toks
    tl.store(at, tl.load(at, mask=mask_r, other=0.0) + node, mask=mask_r)


@triton.jit(do_not_specialize=['k0', 'rows', 'corner', 'old'])  # the chunk's rows: one compile for every chunk
def _update_queries(qbuf_ptr, cb_ptr, u_ptr, k0, rows, corner, old, QROWS, NTOK, RS, CS, W, D, C,
                    FRESH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """U[l] <- exp(-|Cb[corner, l] - Cb[old, l]|) U[l] (nothing when FRESH) + sum_k exp(-|Cb[corner, l] - Cb[k, l]|)
    qbuf[k - k0, l] over the ``rows`` rows k from k0, for column l = program_id(1) and the value channels of block
    program_id(2). Tokens of cb as :func:`_queries` has them; qbuf (BH, QROWS, W, D, C), u (BH, W, D, C),
    float32."""
    bh = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_dc = (offs_d[:, None] < D) & (offs_c[None, :] < C)
    tile = offs_d[:, None] * C + offs_c[None, :]
    cb_col = cb_ptr + bh * NTOK + col * CS
    cb_new = tl.load(cb_col + corner * RS)
    at = u_ptr + (bh * W + col) * D * C + tile
    acc = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
    if not FRESH:
        acc = tl.exp(-tl.abs(cb_new - tl.load(cb_col + old * RS))) * tl.load(at, mask=mask_dc, other=0.0)
    qbuf_ptr += (bh * QROWS * W + col) * D * C
    for r in range(0, rows):
        weight = tl.exp(-tl.abs(cb_new - tl.load(cb_col + (k0 + r) * RS)))
        acc += weight * tl.load(qbuf_ptr + r * W * D * C + tile, mask=mask_dc, other=0.0)
    tl.store(at, acc, mask=mask_dc)


def config(cap: int) -> lp.Config:
    """The passes' launch configuration: the interpreter's, else 4 warps and one stage (no table row of its own:
    tools/check_kernels.py compiles these kernels for spills but does not model them)."""
    return lp.Config(32, 32, 1 if cap == 0 else 4, 1, family='ppmla_chunk')


def block_c(c: int) -> int:
    """The value channels of a program."""
    return min(lp.pow2(c), 32)


class Layout(NamedTuple):
    """A map as a path walks it: ``bh`` images and heads of ``h`` rows of ``w`` tokens, token (i, j) of image and
    head b at b ``ntok`` + i ``rs`` + j ``cs`` of a contiguous (B, heads, H, W, ...) tensor (V2H: the map itself;
    H2V: the map transposed, rows and columns swapped by the strides)."""
    bh: int
    h: int
    w: int
    ntok: int
    rs: int
    cs: int

    @classmethod
    def of(cls, x: torch.Tensor, transposed: bool) -> 'Layout':
        b, heads, h, w = x.shape[:4]
        return cls(b * heads, w, h, h * w, 1, w) if transposed else cls(b * heads, h, w, h * w, w, 1)

    @property
    def strides(self) -> Tuple[int, int, int, int]:
        """The kernels' (NTOK, RS, CS, W)."""
        return self.ntok, self.rs, self.cs, self.w

    def bounds(self, rows: int) -> Bounds:
        """The chunks of ``rows`` rows, top to bottom."""
        return [(r0, min(r0 + rows, self.h)) for r0 in range(0, self.h, rows)]


def pass_launches(s1, s2, v, ca, cb, out, state, layout: Layout, rows: int, cap: int) -> List[lp.Launch]:
    """The forward's launches of V2H on ``layout`` in chunks of ``rows`` rows, adding its product to ``out``: the down
    walk (each chunk's own keys and the state of those above it), then the up walk (the state of those below).
    s1, s2 (B, heads, H, W, d), v (.., c) of any float dtype, out (.., c) float32; ca, cb (B, heads, H, W) the
    layout's row and column tables, float32; state (>= B heads W d c) float32 scratch; all contiguous."""
    d, c = s1.shape[-1], v.shape[-1]
    cfg = config(cap)
    blocks = dict(BLOCK_D=lp.pow2(d), BLOCK_C=block_c(c))
    cblocks = lp.cdiv(c, blocks['BLOCK_C'])
    precision = lp.precision(torch.float32)
    launches = []

    def visit(r0, r1, corner, n, last, down):
        if down or corner is not None:
            launches.append(lp.Launch(_queries, (layout.bh, r1 - r0, cblocks), (
                s1, s2, v, ca, cb, state, out, r0, r1 - r0, corner or 0, *layout.strides, d, c),
                dict(HAS_STATE=corner is not None, INTRA=down, DOT_PRECISION=precision, BLOCK_R=lp.pow2(r1 - r0),
                     **blocks), cfg, s1.device))

    def move(r0, r1, corner, old, fresh):
        launches.append(_state_update(s2, v, cb, state, layout, r0, r1, corner, old, fresh, cfg))

    _walks(layout.bounds(rows), visit, move)
    return launches


def _state_update(s2, v, cb, state, layout: Layout, r0, r1, corner, old, fresh, cfg) -> lp.Launch:
    """The :func:`_update` launch moving S from row ``old`` to ``corner`` and adding the rows [r0, r1)."""
    d, c = s2.shape[-1], v.shape[-1]
    return lp.Launch(_update, (layout.bh, layout.w, lp.cdiv(c, block_c(c))), (
        s2, v, cb, state, r0, r1 - r0, corner, old, *layout.strides, d, c),
        dict(FRESH=fresh, DOT_PRECISION=lp.precision(torch.float32), BLOCK_R=lp.pow2(r1 - r0), BLOCK_D=lp.pow2(d),
             BLOCK_C=block_c(c)), cfg, s2.device)


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


def grad_launches(g, s1, s2, v, ca, cb, state, u, qbuf, ds1, ds2, dv, node, layout: Layout, rows: int,
                  node_kinds: Tuple[int, int], cap: int) -> List[lp.Launch]:
    """The backward's launches of V2H on ``layout`` in chunks of ``rows`` rows, the down walk (the pairs inside each
    chunk and those with the keys above) then the up walk, adding to ds1 and ds2 (per value-channel block: (blocks,
    B heads H W, d)), dv (B heads H W, c) and the tables' node gradients (blocks, 2 sweeps, 2, B heads H W): those
    of the layout's row table at ``node_kinds[0]``, of its column table at ``node_kinds[1]``. g, v (B, heads, H, W,
    c), s1, s2 (.., d) of any float dtype; ca, cb as :func:`pass_launches` takes them; state, u (>= B heads W d c)
    and qbuf (>= B heads rows W d c) scratch; float32, contiguous."""
    d, c = s1.shape[-1], v.shape[-1]
    cfg = config(cap)
    blocks = dict(BLOCK_D=lp.pow2(d), BLOCK_C=block_c(c), DOT_PRECISION=lp.precision(torch.float32))
    cblocks = lp.cdiv(c, blocks['BLOCK_C'])
    tokens = layout.bh * layout.ntok
    node_a, node_b = (kind * tokens for kind in node_kinds)
    launches = []

    def visit(r0, r1, corner, n, last, down):
        state_ = corner is not None
        keep = down or n > 0  # the chunk's queries for its own keys (down) or for the state U (up: not the last)
        if not (down or state_ or keep):
            return
        sign = 1.0 if down else -1.0
        flags = dict(HAS_STATE=state_, INTRA=down, BLOCK_R=lp.pow2(r1 - r0), **blocks)
        launches.append(lp.Launch(_grad_queries, (layout.bh, r1 - r0, cblocks), (
            s1, s2, v, g, ca, cb, state, qbuf, ds1, node, r0, r1 - r0, corner or 0, sign, rows, tokens,
            *layout.strides, d, c, node_a, node_b), dict(KEEP_Q=keep, **flags), cfg, s1.device))
        if down or state_:
            launches.append(lp.Launch(_grad_keys, (layout.bh, layout.w, cblocks), (
                s2, v, cb, u, qbuf, ds2, dv, node, r0, r1 - r0, corner or 0, sign, rows, tokens, *layout.strides, d,
                c, node_b), flags, cfg, s1.device))

    def move(r0, r1, corner, old, fresh):
        launches.append(_state_update(s2, v, cb, state, layout, r0, r1, corner, old, fresh, cfg))
        launches.append(lp.Launch(_update_queries, (layout.bh, layout.w, cblocks), (
            qbuf, cb, u, r0, r1 - r0, corner, old, rows, *layout.strides, d, c),
            dict(FRESH=fresh, BLOCK_D=blocks['BLOCK_D'], BLOCK_C=blocks['BLOCK_C']), cfg, s1.device))

    _walks(layout.bounds(rows), visit, move)
    return launches
