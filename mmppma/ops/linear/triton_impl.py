"""PPMLA and PPMDA, fused Triton kernels: ``((q k^T) * L) v`` and the normalizer ``((q' k'^T) * L) 1`` with no
N x N tensor and no per-token d x d_v state in memory (docs/method.md, section 5).

Dense flash-style form: a program holds one tile of an image row (its own tokens) and visits every other token,
one image row (in column chunks) at a time: scores by a tensor-core product, times the mask built in registers
from the decay tables, into the output by a second product. With own row r and other row r2, in the (own, other)
coordinates both paths' corners are vectors (tables in log2 units, log-decays <= 0 so a segment is minus an
absolute difference):

* E1 = exp2(-|Ca[r, c] - Ca[r, c2]| - |Cb[r, c2] - Cb[r2, c2]|): corner (own row, other column);
* E2 = exp2(-|Ca[r2, c2] - Ca[r2, c]| - |Cb[r2, c] - Cb[r, c]|): corner (other row, own column).

For queries as own tokens E1 is V2H (M) and E2 is H2V (M^T); for keys as own tokens the reverse. The forward runs
query programs; the backward one launch of query programs (dq, dq') and one of key programs (dk, dv, dk'). Each
program reduces the table gradient of its own row: its own tokens' entries and the corners of E1 (row r, every
column), into its own slot of a (slots, 2, BH, H, W) buffer that the host sums: no atomics.

Products of two input tiles take the inputs' dtype (tensor cores, float32 accumulation); products with a computed
float32 tile (scores times mask) take TF32 under half precision, float32's range. Normalizer, division and tables
stay float32. The features arrive as the inputs or as a feature map's float32 output, rounded to the products'
dtype here.
"""
import functools
from typing import List, Optional, Tuple

import torch
import triton
import triton.language as tl

from ..checks import table_dtype
from ..forms import paths, transposed
from ..masks import decay_tables
from ..triton_support import launch as lp
from ..triton_support.calls import Caller, call_kernels
from .chunked_triton import chunked_triton, uses_chunked_triton
from .reference import FEATURE_MAPS

LOG2E_ = tl.constexpr(1.4426950408889634)
#: the product dtype of the 16-bit tiles: 0 float32 (no rounding), 1 float16, 2 bfloat16
_HALF_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@triton.jit
def _rounded(x, HALF: tl.constexpr):
    """x in the product dtype of the input tiles."""
    if HALF == 1:
        return x.to(tl.float16)
    elif HALF == 2:
        return x.to(tl.bfloat16)
    else:
        return x.to(tl.float32)


@triton.jit
def _rows(ptr, toks, mask, cols, ncols, HALF: tl.constexpr):
    """Token rows ``toks`` of a contiguous (.., ncols) tensor, in the product dtype."""
    x = tl.load(ptr + toks[:, None] * ncols + cols[None, :], mask=mask[:, None] & (cols[None, :] < ncols), other=0.0)
    return _rounded(x, HALF)


@triton.jit
def _wide_rows(ptr, toks, mask, cols, ncols):
    """Token rows ``toks`` of a contiguous (.., ncols) tensor in float32: the operand of a product with a computed
    float32 tile."""
    return tl.load(ptr + toks[:, None] * ncols + cols[None, :], mask=mask[:, None] & (cols[None, :] < ncols),
                   other=0.0).to(tl.float32)


@triton.jit
def _masks(ca_ptr, cb_ptr, W, cols, mask_own, ca_own, cb_own, r2, cols2, mask_oth, ca_c1, cb_c1, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, USE1: tl.constexpr, USE2: tl.constexpr):
    """(E1, E2) on the tile (own tokens x other row r2's columns ``cols2``), each zero where unused. ``ca_own``,
    ``cb_own``: the own tokens' entries (+inf past the row); ``ca_c1``, ``cb_c1``: the own row's entries at
    ``cols2`` (E1's corners). Others past the row read +inf: no weight."""
    e1 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    e2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    tok = r2 * W + cols2
    if USE1:
        cb_oth = tl.load(cb_ptr + tok, mask=mask_oth, other=float('inf')) * LOG2E_
        e1 = tl.math.exp2(-tl.abs(ca_own[:, None] - ca_c1[None, :]) - tl.abs(cb_c1 - cb_oth)[None, :])
    if USE2:
        ca_oth = tl.load(ca_ptr + tok, mask=mask_oth, other=float('inf')) * LOG2E_
        ca_c2 = tl.load(ca_ptr + r2 * W + cols, mask=mask_own, other=0.0) * LOG2E_
        cb_c2 = tl.load(cb_ptr + r2 * W + cols, mask=mask_own, other=0.0) * LOG2E_
        e2 = tl.math.exp2(-tl.abs(ca_oth[None, :] - ca_c2[:, None]) - tl.abs(cb_c2 - cb_own)[:, None])
    return e1, e2


@triton.jit
def _own_tile(ca_ptr, cb_ptr, W, H, BLOCK_M: tl.constexpr):
    """This program's slice, own row and own columns (axis 0: slices x rows x column chunks), the tables moved to
    the slice, and the own tokens' table entries in log2 units (+inf past the row)."""
    chunks = tl.cdiv(W, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // (H * chunks)
    r = pid // chunks % H
    chunk = pid % chunks
    cols = chunk * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = cols < W
    n = H * W
    ca_ptr += bh.to(tl.int64) * n
    cb_ptr += bh.to(tl.int64) * n
    ca_own = tl.load(ca_ptr + r * W + cols, mask=mask, other=float('inf')) * LOG2E_
    cb_own = tl.load(cb_ptr + r * W + cols, mask=mask, other=float('inf')) * LOG2E_
    return bh, r, chunk, cols, mask, ca_ptr, cb_ptr, ca_own, cb_own


@triton.jit
def _ppmla_fwd(q_ptr, k_ptr, v_ptr, qn_ptr, kn_ptr, ca_ptr, cb_ptr, o_ptr, z_ptr, eps, H, W, D, DV,
               USE1: tl.constexpr, USE2: tl.constexpr, NORMALIZE: tl.constexpr, SEPARATE: tl.constexpr,
               HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr, WIDE: tl.constexpr):
    """The output of one own tile of queries: o = (sum_s S L v) / (z + eps), z = sum_s S' L (NORMALIZE; S' = S
    unless SEPARATE), S = q k^T. q, k, qn, kn (BH, N, D) and v (BH, N, DV) contiguous; o (BH, N, DV) and z (BH, N)
    float32."""
    bh, r, chunk, cols, mask, ca_ptr, cb_ptr, ca_own, cb_own = _own_tile(ca_ptr, cb_ptr, W, H, BLOCK_M)
    n = H * W
    q_ptr += bh.to(tl.int64) * n * D
    k_ptr += bh.to(tl.int64) * n * D
    qn_ptr += bh.to(tl.int64) * n * D
    kn_ptr += bh.to(tl.int64) * n * D
    v_ptr += bh.to(tl.int64) * n * DV
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    toks = r * W + cols
    q = _rows(q_ptr, toks, mask, offs_d, D, HALF)
    if SEPARATE:
        qn = _rows(qn_ptr, toks, mask, offs_d, D, HALF)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    z = tl.zeros([BLOCK_M], tl.float32)
    for c0 in range(0, W, BLOCK_N):
        cols2 = c0 + tl.arange(0, BLOCK_N)
        in_row = cols2 < W
        ca_c1 = tl.load(ca_ptr + r * W + cols2, mask=in_row, other=0.0) * LOG2E_
        cb_c1 = tl.load(cb_ptr + r * W + cols2, mask=in_row, other=0.0) * LOG2E_
        for r2 in range(0, H):
            toks2 = r2 * W + cols2
            e1, e2 = _masks(ca_ptr, cb_ptr, W, cols, mask, ca_own, cb_own, r2, cols2, in_row, ca_c1, cb_c1, BLOCK_M,
                            BLOCK_N, USE1, USE2)
            lmask = e1 + e2
            s = tl.dot(q, tl.trans(_rows(k_ptr, toks2, in_row, offs_d, D, HALF)), input_precision=PRECISION)
            acc = tl.dot(s * lmask, _wide_rows(v_ptr, toks2, in_row, offs_dv, DV), acc, input_precision=WIDE)
            if NORMALIZE:
                if SEPARATE:
                    s = tl.dot(qn, tl.trans(_rows(kn_ptr, toks2, in_row, offs_d, D, HALF)), input_precision=PRECISION)
                z += tl.sum(s * lmask, 1)
    tok64 = bh.to(tl.int64) * n + toks
    if NORMALIZE:
        acc = acc / (z + eps)[:, None]
        tl.store(z_ptr + tok64, z, mask=mask)
    tl.store(o_ptr + tok64[:, None] * DV + offs_dv[None, :], acc, mask=mask[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _ppmla_bwd(q_ptr, k_ptr, v_ptr, qn_ptr, kn_ptr, ca_ptr, cb_ptr, g_ptr, rz_ptr, dz_ptr, g1_ptr, g2_ptr, g3_ptr,
               tables_ptr, plane, H, W, D, DV, KEYS: tl.constexpr, USE1: tl.constexpr, USE2: tl.constexpr,
               NORMALIZE: tl.constexpr, SEPARATE: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
               WIDE: tl.constexpr):
    """The gradients of one own tile, queries or (KEYS) keys, against every other token. With dn = g rz (rz =
    1 / (z + eps), or 1) and dz = -(g . o) rz per query (host), dA = dn v^T and the mask's gradient
    G = dA * S + dz * S' per (query, key):

    * queries: g1 = dq = (dA L) k (+ dz L k when S' = S), g2 = dq' = dz (L k') (SEPARATE);
    * keys: g1 = dk = (dA L)^T q (+ ...), g2 = dk' = (dz L)^T q' (SEPARATE), g3 = dv = (S L rz)^T g.

    Table gradients of the own row into ``tables_ptr`` (slots, 2, BH, H, W), ``plane`` = BH * N: slot 0 the own
    tokens', slot 1 + chunk E1's corners (the own row at every column); signs by index order (the segment-sum
    convention, exact at ties)."""
    bh, r, chunk, cols, mask, ca_ptr, cb_ptr, ca_own, cb_own = _own_tile(ca_ptr, cb_ptr, W, H, BLOCK_M)
    n = H * W
    base = bh.to(tl.int64) * n
    q_ptr += base * D
    k_ptr += base * D
    qn_ptr += base * D
    kn_ptr += base * D
    v_ptr += base * DV
    g_ptr += base * DV
    rz_ptr += base
    dz_ptr += base
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    toks = r * W + cols
    if KEYS:
        a_ptr, an_ptr, da_ptr, b_ptr, bn_ptr, db_ptr = k_ptr, kn_ptr, v_ptr, q_ptr, qn_ptr, g_ptr
    else:
        a_ptr, an_ptr, da_ptr, b_ptr, bn_ptr, db_ptr = q_ptr, qn_ptr, g_ptr, k_ptr, kn_ptr, v_ptr
    a = _rows(a_ptr, toks, mask, offs_d, D, HALF)
    da = _rows(da_ptr, toks, mask, offs_dv, DV, HALF)
    if SEPARATE:
        an = _rows(an_ptr, toks, mask, offs_d, D, HALF)
    if NORMALIZE and not KEYS:
        rz_own = tl.load(rz_ptr + toks, mask=mask, other=0.0)[:, None]
        dz_own = tl.load(dz_ptr + toks, mask=mask, other=0.0)[:, None]
    g1 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    g2 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    g3 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    own_a = tl.zeros([BLOCK_M], tl.float32)  # the own tokens' Ca gradient (E1's row segment)
    own_b = tl.zeros([BLOCK_M], tl.float32)  # the own tokens' Cb gradient (E2's column segment)
    tables_ptr += base
    for c0 in range(0, W, BLOCK_N):
        cols2 = c0 + tl.arange(0, BLOCK_N)
        in_row = cols2 < W
        ca_c1 = tl.load(ca_ptr + r * W + cols2, mask=in_row, other=0.0) * LOG2E_
        cb_c1 = tl.load(cb_ptr + r * W + cols2, mask=in_row, other=0.0) * LOG2E_
        # +1 where the own column follows the other's, -1 where it precedes, 0 on it: the row segment's sign
        col_sign = tl.where(cols[:, None] > cols2[None, :], 1.0, tl.where(cols[:, None] < cols2[None, :], -1.0, 0.0))
        corner_a = tl.zeros([BLOCK_N], tl.float32)
        corner_b = tl.zeros([BLOCK_N], tl.float32)
        for r2 in range(0, H):
            toks2 = r2 * W + cols2
            e1, e2 = _masks(ca_ptr, cb_ptr, W, cols, mask, ca_own, cb_own, r2, cols2, in_row, ca_c1, cb_c1, BLOCK_M,
                            BLOCK_N, USE1, USE2)
            lmask = e1 + e2
            b = _rows(b_ptr, toks2, in_row, offs_d, D, HALF)
            db = _rows(db_ptr, toks2, in_row, offs_dv, DV, HALF)
            s = tl.dot(a, tl.trans(b), input_precision=PRECISION)
            dadb = tl.dot(da, tl.trans(db), input_precision=PRECISION)
            d_s = dadb  # dA, in (own, other) coordinates
            grad = d_s * s  # the mask's gradient
            if NORMALIZE:
                if KEYS:
                    rz = tl.load(rz_ptr + toks2, mask=in_row, other=0.0)[None, :]
                    dz = tl.load(dz_ptr + toks2, mask=in_row, other=0.0)[None, :]
                else:
                    rz = rz_own
                    dz = dz_own
                d_s = dadb * rz
                if SEPARATE:
                    grad = d_s * s + dz * tl.dot(an, tl.trans(_rows(bn_ptr, toks2, in_row, offs_d, D, HALF)),
                                                 input_precision=PRECISION)
                    g2 = tl.dot(dz * lmask, _wide_rows(bn_ptr, toks2, in_row, offs_d, D), g2, input_precision=WIDE)
                else:
                    d_s = d_s + dz
                    grad = d_s * s
            g1 = tl.dot(d_s * lmask, _wide_rows(b_ptr, toks2, in_row, offs_d, D), g1, input_precision=WIDE)
            if KEYS:
                if NORMALIZE:
                    g3 = tl.dot(s * lmask * rz, db.to(tl.float32), g3, input_precision=WIDE)
                else:
                    g3 = tl.dot(s * lmask, db.to(tl.float32), g3, input_precision=WIDE)
            row_sign = tl.where(r > r2, 1.0, tl.where(r < r2, -1.0, 0.0))
            if USE1:
                w1 = grad * e1
                signed = w1 * col_sign
                own_a += tl.sum(signed, 1)
                corner_a -= tl.sum(signed, 0)
                corner_b += tl.sum(w1, 0) * row_sign
            if USE2:
                own_b += tl.sum(grad * e2, 1) * row_sign
        at = tables_ptr + (1 + chunk).to(tl.int64) * 2 * plane + r * W + cols2
        tl.store(at, corner_a, mask=in_row)
        tl.store(at + plane, corner_b, mask=in_row)
    at = tables_ptr + r * W + cols
    tl.store(at, own_a, mask=mask)
    tl.store(at + plane, own_b, mask=mask)
    tok64 = base + toks
    tl.store(g1_ptr + tok64[:, None] * D + offs_d[None, :], g1, mask=mask[:, None] & (offs_d[None, :] < D))
    if SEPARATE:
        tl.store(g2_ptr + tok64[:, None] * D + offs_d[None, :], g2, mask=mask[:, None] & (offs_d[None, :] < D))
    if KEYS:
        tl.store(g3_ptr + tok64[:, None] * DV + offs_dv[None, :], g3, mask=mask[:, None] & (offs_dv[None, :] < DV))


def _tiles(cfg: lp.Config, width: int):
    """(own columns, other columns) of a tile on rows ``width`` tokens long. The backward's own tiles of 32 in half
    precision take others of 16: the key programs spill at 32 x 32 (tools/check_kernels.py)."""
    own, other = min(cfg.block_m, lp.pow2(width)), min(cfg.block_n, lp.pow2(width))
    if cfg.family == 'ppmla_bwd' and own == 32 and cfg.block_m > 32:
        other = 16
    return own, other


def _precisions(half: int):
    """(PRECISION, WIDE): the products of two input tiles, and those with a computed float32 tile."""
    if half:
        return None, 'tf32'
    return (lp.precision(torch.float32), ) * 2


def _compute_dtype(half: int) -> torch.dtype:
    return next(dtype for dtype, code in _HALF_CODES.items() if code == half)


def forward_launches(q, k, v, qn, kn, ca, cb, form: str, normalize: bool, separate: bool, eps: float, half: int,
                     cap: int):
    """The forward's one launch (:func:`_ppmla_fwd`) and its float32 outputs o (B, heads, H, W, dv) and z
    (B, heads, H, W; empty unless ``normalize``). q, k, qn, kn: (B, heads, H, W, d), v (B, heads, H, W, dv),
    ca, cb (B, heads, H, W) float32, all contiguous; ``half``: the products' dtype (:data:`_HALF_CODES`)."""
    b, heads, hh, ww, d = q.shape
    dv = v.shape[-1]
    cfg = lp.config('ppmla_fwd', hh * ww, _compute_dtype(half), cap)
    block_m, block_n = _tiles(cfg, ww)
    names = paths(form)
    o = torch.empty(b, heads, hh, ww, dv, device=q.device, dtype=torch.float32)
    z = torch.empty(b, heads, hh, ww, device=q.device, dtype=torch.float32) if normalize else o.new_empty(0)
    precision, wide = _precisions(half)
    launch = lp.Launch(_ppmla_fwd, (b * heads * hh * lp.cdiv(ww, block_m), ), (
        q, k, v, qn, kn, ca, cb, o, z if normalize else o, float(eps), hh, ww, d, dv),
        dict(USE1='v2h' in names, USE2='h2v' in names, NORMALIZE=normalize, SEPARATE=separate, HALF=half,
             BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=lp.pow2(d), BLOCK_DV=lp.pow2(dv), PRECISION=precision,
             WIDE=wide), cfg, q.device)
    return [launch], o, z


def backward_launches(g, q, k, v, qn, kn, ca, cb, o, z, form: str, normalize: bool, separate: bool, eps: float,
                      half: int, cap: int):
    """The backward's two launches (:func:`_ppmla_bwd`: queries, then keys) and the float32 buffers they fill:
    dq, dk, dv, dq', dk' (the last two empty unless ``separate``) and the table gradients (slots, 2, B * heads, H,
    W), whose sum over the slots is (dCa, dCb). g: the output gradient, contiguous; the rest as
    :func:`forward_launches` takes and returns them."""
    b, heads, hh, ww, d = q.shape
    dv = v.shape[-1]
    cfg = lp.config('ppmla_bwd', hh * ww, _compute_dtype(half), cap)
    block_m, block_n = _tiles(cfg, ww)
    chunks = lp.cdiv(ww, block_m)
    f32 = dict(device=q.device, dtype=torch.float32)
    if normalize:
        rz = 1.0 / (z + eps)
        dz = -(g.float() * o).sum(-1) * rz
    else:
        rz = dz = ca  # not read
    grads = [torch.empty(q.shape, **f32), torch.empty(k.shape, **f32), torch.empty(v.shape, **f32)]
    grads += [torch.empty(q.shape, **f32), torch.empty(k.shape, **f32)] if separate else [o.new_empty(0)] * 2
    tables = torch.zeros(2 * (1 + chunks), 2, b * heads, hh, ww, **f32)
    names = paths(form)
    precision, wide = _precisions(half)
    launches = []
    for keys in (False, True):
        g1, g2 = (grads[1], grads[4]) if keys else (grads[0], grads[3])
        # the own tokens' E1 is V2H for queries, H2V for keys
        use1, use2 = ('h2v', 'v2h') if keys else ('v2h', 'h2v')
        launches.append(lp.Launch(_ppmla_bwd, (b * heads * hh * chunks, ), (
            q, k, v, qn, kn, ca, cb, g, rz, dz, g1, g2 if separate else g1, grads[2], tables[(1 + chunks) * keys:],
            b * heads * hh * ww, hh, ww, d, dv),
            dict(KEYS=keys, USE1=use1 in names, USE2=use2 in names, NORMALIZE=normalize, SEPARATE=separate,
                 HALF=half, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=lp.pow2(d), BLOCK_DV=lp.pow2(dv),
                 PRECISION=precision, WIDE=wide), cfg, q.device))
    return launches, (*grads, tables)


def _forward(q, k, v, qn, kn, ca, cb, form: str, normalize: bool, separate: bool, eps: float, half: int,
             keep: bool = True):
    """The output in v's dtype, o and z (float32, :func:`forward_launches`). Without ``keep`` (nothing saves o)
    a float32 output is o itself."""
    launches, o, z = forward_launches(q, k, v, qn, kn, ca, cb, form, normalize, separate, eps, half,
                                      lp.capability(q.device))
    lp.run(launches)
    out = o.to(v.dtype, copy=keep)
    return out, o, z


def _backward(g, q, k, v, qn, kn, ca, cb, o, z, form: str, normalize: bool, separate: bool, eps: float, half: int):
    """The gradients of q, k, v, q', k' (None for the last two unless ``separate``), Ca and Cb."""
    launches, (dq, dk, dv, dqn, dkn, tables) = backward_launches(
        g.contiguous(), q, k, v, qn, kn, ca, cb, o, z, form, normalize, separate, eps, half, lp.capability(q.device))
    lp.run(launches)
    dca, dcb = tables.sum(0)
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dqn.to(qn.dtype) if separate else None,
            dkn.to(kn.dtype) if separate else None, dca.view(ca.shape), dcb.view(cb.shape))


def _forward_shapes(q, k, v, qn, kn, ca, cb, form, normalize, separate, eps, half):
    return (v.new_empty(v.shape), v.new_empty(v.shape, dtype=torch.float32),
            ca.new_empty(ca.shape if normalize else (0, ), dtype=torch.float32))


def _op_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qn: torch.Tensor, kn: torch.Tensor,
                ca: torch.Tensor, cb: torch.Tensor, form: str, normalize: bool, separate: bool, eps: float,
                half: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, qn, kn, ca, cb, form, normalize, separate, eps, half)


def _op_backward(g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qn: torch.Tensor,
                 kn: torch.Tensor, ca: torch.Tensor, cb: torch.Tensor, o: torch.Tensor, z: torch.Tensor, form: str,
                 normalize: bool, separate: bool, eps: float, half: int) -> List[torch.Tensor]:
    grads = _backward(g, q, k, v, qn, kn, ca, cb, o, z, form, normalize, separate, eps, half)
    # a library op returns tensors, none sharing storage: the unused gradients empty, dcb apart from dca's sum
    return [x if x is not None else q.new_empty(0) for x in grads[:5]] + [grads[5], grads[6].clone()]


def _backward_shapes(g, q, k, v, qn, kn, ca, cb, o, z, form, normalize, separate, eps, half):
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            *((qn.new_empty(qn.shape), kn.new_empty(kn.shape)) if separate else (q.new_empty(0), k.new_empty(0))),
            ca.new_empty(ca.shape), cb.new_empty(cb.shape)]


linear_attention_op = lp.library_op('linear_attention_triton', _op_forward, _forward_shapes)
linear_attention_backward_op = lp.library_op('linear_attention_triton_backward', _op_backward, _backward_shapes)


def _save(ctx, inputs, output):
    *tensors, form, normalize, separate, eps, half = inputs
    ctx.save_for_backward(*tensors, *output[1:])
    ctx.mark_non_differentiable(*output[1:])
    ctx.args = (form, normalize, separate, eps, half)


def _gradients(ctx, dout, do, dz):
    grads = linear_attention_backward_op(dout, *ctx.saved_tensors, *ctx.args)
    separate = ctx.args[2]
    return (*grads[:3], *(grads[3:5] if separate else (None, None)), *grads[5:], None, None, None, None, None)


linear_attention_op.register_autograd(_gradients, setup_context=_save)

#: the eager path of :data:`linear_attention_op` (:class:`~mmppma.ops.triton_support.calls.KernelFunction`): o and z
#: saved, not returned
LINEAR_KERNELS = (_forward, _backward, 7)


def _infer(*inputs):
    return _forward(*inputs, keep=False)


def linear_attention_triton(q, k, v, qn, kn, ca, cb, form: str, normalize: bool, eps: float,
                            dtype: torch.dtype, caller: Caller, traced: Optional[bool] = None) -> torch.Tensor:
    """``((q k^T) * L) v`` for the mask of ``form``, divided by ``((qn kn^T) * L) 1 + eps`` when ``normalize``
    (``qn``, ``kn`` may be q and k themselves). q, k, qn, kn: (B, heads, H, W, d) features; v: (B, heads, H, W,
    dv); ca, cb: (B, heads, H, W) decay tables; ``dtype``: the products' (float16, bfloat16 or float32);
    ``caller``: what errors name; ``traced``: whether torch.compile traces the call (None: ask). An image narrower
    than ``lp.NARROW`` tokens and at least that tall runs transposed (its rows are long)."""
    hh, ww = q.shape[2], q.shape[3]
    separate = normalize and (qn is not q or kn is not k)
    if ww < lp.NARROW <= hh:
        def t(x):
            return x.transpose(2, 3)
        q, k = t(q), t(k)
        qn, kn = (t(qn), t(kn)) if separate else (q, k)
        return t(linear_attention_triton(q, k, t(v), qn, kn, t(cb), t(ca), transposed(form), normalize, eps, dtype,
                                         caller, traced))
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    qn, kn = (qn.contiguous(), kn.contiguous()) if separate else (q, k)
    ca, cb = ca.float().contiguous(), cb.float().contiguous()
    half = _HALF_CODES.get(dtype, 0)
    return call_kernels(caller, linear_attention_op, LINEAR_KERNELS, _infer, traced, q, k, v, qn, kn, ca, cb, form,
                        normalize, separate, float(eps), half)


def product_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype of the fused kernels' products of input tiles: the inputs' when all are float16 or all bfloat16,
    else float32."""
    dtype = tensors[0].dtype
    if dtype in (torch.float16, torch.bfloat16) and all(t.dtype == dtype for t in tensors):
        return dtype
    return torch.float32


def runs_chunked(s1: torch.Tensor, v: torch.Tensor, form: str, traced: Optional[bool]) -> bool:
    """Whether the Triton path of PPMLA / PPMDA runs the chunked form (:mod:`.chunked_triton`) on these shapes:
    where :func:`~.chunked_triton.uses_chunked_triton` counts it cheaper; not while torch.compile traces (the traced
    graph keeps the dense kernels' library op)."""
    if torch.compiler.is_compiling() if traced is None else traced:
        return False
    return uses_chunked_triton(s1.shape[2], s1.shape[3], s1.shape[-1], v.shape[-1], form)


def chunked_form(s1, s2, v, la, lb, form: str, rows: Optional[int] = None, caller: Optional[Caller] = None):
    """PPMDA by the chunked form's kernels, in v's dtype (:func:`~.chunked_triton.chunked_triton`)."""
    return chunked_triton(s1, s2, v, la, lb, form, rows, caller).to(v.dtype)


def ppma_decomposed_attention_plan(s1, s2, v, la, lb, form: str, chunk: int, traced: Optional[bool]):
    """The Triton path of :func:`~mmppma.ops.ppma_decomposed_attention` (:class:`~mmppma.ops.plan.Op`): the fused
    kernels on s1, s2 as features, no normalizer; the chunked form's where it counts cheaper."""
    caller, dtype = Caller.of('ppma_decomposed_attention', s1), product_dtype(s1, s2, v)
    if runs_chunked(s1, v, form, traced):
        return functools.partial(chunked_form, form=form, caller=caller)

    def fused(s1, s2, v, la, lb):
        return linear_attention_triton(s1, s2, v, s1, s2, *decay_tables(la, lb), form, False, 0.0, dtype, caller,
                                       traced)
    return fused


def ppma_linear_attention_plan(q, k, v, la, lb, *normalizer_and_options):
    """The Triton path of :func:`~mmppma.ops.ppma_linear_attention`: the fused kernels (or where it counts cheaper
    the chunked form's) on the features (the inputs themselves for the identity map: no float32 copies; else the
    feature map's float32 output), which keep the products' sums, the mass and the division in float32.
    ``normalizer_and_options`` as the reference path's, then ``traced``."""
    *_, form, feature_map, normalize, eps, chunk, traced = normalizer_and_options
    caller, dtype = Caller.of('ppma_linear_attention', q), product_dtype(q, k, v)
    identity = feature_map is FEATURE_MAPS['identity']
    chunked = runs_chunked(q, v, form, traced)

    def features(q, k, v, la, lb, normalizer):
        if identity:
            return q, k, *(normalizer or (q, k))
        dtype = table_dtype(q, k, v, la, lb)
        fq, fk = feature_map(q.to(dtype)), feature_map(k.to(dtype))
        return fq, fk, *((feature_map(x.to(dtype)) for x in normalizer) if normalizer else (fq, fk))

    def fused(q, k, v, la, lb, *normalizer):
        fq, fk, fqn, fkn = features(q, k, v, la, lb, normalizer)
        if chunked:
            return chunked_triton(fq, fk, v, la, lb, form, None, caller, (fqn, fkn) if normalize else None,
                                  eps).to(v.dtype)
        return linear_attention_triton(fq, fk, v, fqn, fkn, *decay_tables(la, lb), form, normalize, eps, dtype,
                                       caller, traced)
    return fused
