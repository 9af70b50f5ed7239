"""PPMLA and PPMDA, the chunked form on the Triton path: ``((s1 s2^T) * L) v`` with work and memory linear in N
(docs/method.md §5), in float32.

Only V2H runs here; H2V is V2H on the transposed map (rows and columns swapped, la and lb swapped), '2d' the sum of
both. A V2H path cuts the map into chunks of R full rows. Inside a chunk the dense fused kernel
(``dense``, :func:`~.triton_impl.dense_v2h`, handed in by the caller) runs on the chunks as a batch of R x W
sub-maps. Between chunks a
rolling state per column, one (B * heads, W, d, c) float32 buffer per call, carries the keys of the other chunks
to a corner row: the down pass walks the chunks top to bottom (corner: the row above the chunk), the up pass bottom
to top (corner: the chunk's last row). Cb is monotone along a column, so every column factor is
``exp(-|Cb[a, l] - Cb[b, l]|)`` and both passes run the same two kernels:

* :func:`_queries`: one program per (image and head, query row, block of value channels) sweeps its row once
  forward and once backward with a d x BLOCK_C state in registers (the row scans of the states decayed from the
  corner to the row, the diagonal counted once) and adds ``s1 . (scan)`` to its own outputs;
* :func:`_update`: one program per (image and head, column, block of value channels) moves the state to the next
  corner and adds the keys of the chunk just passed (a product over the chunk's rows).

:class:`_ChunkedTriton` is one autograd node that saves its inputs only: the gradients of s1, s2 and v are this form
on other operands; those of the log-decays come from the torch chunked form (:mod:`.chunked`) recomputed under
autograd inside the backward. :func:`uses_chunked_triton` is the crossover against the dense kernels.
"""
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from mmppma.utils.checks import check_choice

from ..forms import MASK_FORMS, paths, transposed
from ..triton_support import launch as lp
from ..triton_support.calls import Caller, raise_named
from .chunked import decay_gradients, dense_counts

#: the rows of a chunk: the dense kernel's sub-maps are 16-row tensor-core tiles tall; fewer rows add launches (four
#: per chunk, pass and path) for little less intra-chunk work
CHUNK_ROWS = 16
#: weight of a pass's multiply-add against one of the dense kernel's: the passes' sequential row sweeps and their
#: one-row programs run on the FMA units, the dense kernel's products on tensor cores
PASS_WEIGHT = 4
#: the chunked form runs where its weighted count is below the dense form's by this factor: it pays a host loop and
#: 4 launches per chunk, pass and path that the count does not see
MARGIN = 2


@triton.jit
def _queries(s1_ptr, ca_ptr, cb_ptr, state_ptr, out_ptr, r0, corner, H, W, D, C, BLOCK_D: tl.constexpr,
             BLOCK_C: tl.constexpr):
    """out[i, j] += s1[i, j] . sum_l exp(-|Ca[i, j] - Ca[i, l]|) exp(-|Cb[i, l] - Cb[corner, l]|) S[l] for the
    query row i = r0 + program_id(1), value channels of block program_id(2). s1 (BH, H, W, D), out (BH, H, W, C),
    ca, cb (BH, H, W), state (BH, W, D, C), all float32 and contiguous."""
    bh = tl.program_id(0).to(tl.int64)
    row = bh * H + r0 + tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    mask_dc = (offs_d[:, None] < D) & mask_c[None, :]
    tile = offs_d[:, None] * C + offs_c[None, :]
    ca_row = ca_ptr + row * W
    cb_row = cb_ptr + row * W
    cb_corner = cb_ptr + (bh * H + corner) * W
    state_ptr += bh * W * D * C
    s1_ptr += row * W * D
    out_ptr += row * W * C
    # forward sweep: scan[j] = exp(-|Ca[j] - Ca[j - 1]|) scan[j - 1] + x[j]
    scan = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
    prev = tl.load(ca_row)
    for j in range(0, W):
        ca = tl.load(ca_row + j)
        x = tl.exp(-tl.abs(tl.load(cb_row + j) - tl.load(cb_corner + j))) * tl.load(state_ptr + j * D * C + tile,
                                                                                  mask=mask_dc, other=0.0)
        scan = tl.exp(-tl.abs(ca - prev)) * scan + x
        prev = ca
        s1 = tl.load(s1_ptr + j * D + offs_d, mask=offs_d < D, other=0.0)
        at = out_ptr + j * C + offs_c
        tl.store(at, tl.load(at, mask=mask_c, other=0.0) + tl.sum(s1[:, None] * scan, 0), mask=mask_c)
    # backward sweep, the diagonal (x[j] itself) already counted
    scan = tl.zeros([BLOCK_D, BLOCK_C], tl.float32)
    prev = tl.load(ca_row + W - 1)
    for jj in range(0, W):
        j = W - 1 - jj
        ca = tl.load(ca_row + j)
        x = tl.exp(-tl.abs(tl.load(cb_row + j) - tl.load(cb_corner + j))) * tl.load(state_ptr + j * D * C + tile,
                                                                                  mask=mask_dc, other=0.0)
        scan = tl.exp(-tl.abs(ca - prev)) * scan + x
        prev = ca
        s1 = tl.load(s1_ptr + j * D + offs_d, mask=offs_d < D, other=0.0)
        at = out_ptr + j * C + offs_c
        tl.store(at, tl.load(at, mask=mask_c, other=0.0) + tl.sum(s1[:, None] * (scan - x), 0), mask=mask_c)


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


def _config(cap: int) -> lp.Config:
    """The passes' launch configuration: the interpreter's, else 4 warps and one stage (no table row of its own:
    tools/check_kernels.py does not compile these kernels)."""
    return lp.Config(32, 32, 1 if cap == 0 else 4, 1, family='ppmla_chunk')


def _block_c(c: int) -> int:
    return min(lp.pow2(c), 32)


def pass_launches(s1, s2, v, ca, cb, out, state, bounds: List[Tuple[int, int]], cap: int) -> List[lp.Launch]:
    """The launches of V2H's down and up passes over the chunks ``bounds`` (top to bottom), adding to ``out``:
    s1, s2 (BH, H, W, d), v and out (BH, H, W, c), ca, cb (BH, H, W), state (BH, W, d, c), float32, contiguous."""
    bh, h, w, d = s1.shape
    c = v.shape[-1]
    cfg = _config(cap)
    block_d, block_c = lp.pow2(d), _block_c(c)
    cblocks = lp.cdiv(c, block_c)
    precision = lp.precision(torch.float32)
    launches = []

    def query(r0, r1, corner):
        launches.append(lp.Launch(_queries, (bh, r1 - r0, cblocks), (s1, ca, cb, state, out, r0, corner, h, w, d, c),
                                  dict(BLOCK_D=block_d, BLOCK_C=block_c), cfg, s1.device))

    def update(r0, r1, corner, old, fresh):
        launches.append(lp.Launch(_update, (bh, w, cblocks), (s2, v, cb, state, r0, r1 - r0, corner, old, h, w, d, c),
                                  dict(FRESH=fresh, DOT_PRECISION=precision, BLOCK_R=lp.pow2(r1 - r0),
                                       BLOCK_D=block_d, BLOCK_C=block_c), cfg, s1.device))

    last = len(bounds) - 1
    for n, (r0, r1) in enumerate(bounds):  # down: corner r0 - 1, then the state moves to r1 - 1
        if n:
            query(r0, r1, r0 - 1)
        if n < last:
            update(r0, r1, r1 - 1, r0 - 1, n == 0)
    for n in range(last, -1, -1):  # up: corner r1 - 1, then the state moves to r0 - 1
        r0, r1 = bounds[n]
        if n < last:
            query(r0, r1, r1 - 1)
        if n:
            update(r0, r1, r0 - 1, r1 - 1, n == last)
    return launches


def _v2h(s1, s2, v, ca, cb, rows: int, dense: Callable, caller: Caller) -> torch.Tensor:
    """V2H's product on (B, heads, H, W, .) float32 inputs and tables (B, heads, H, W): ``dense(s1, s2, v, ca, cb,
    caller)`` inside the chunks of ``rows`` rows, then the passes; float32 (B, heads, H, W, c)."""
    b, heads, h, w, d = s1.shape
    c = v.shape[-1]
    rows = min(rows, h)
    chunks = lp.cdiv(h, rows)
    pad = chunks * rows - h

    def sub_maps(x):  # (B, heads, H, W, ...) -> (B, heads * chunks, rows, W, ...), padded rows zero
        x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, pad)) if pad else x
        return x.reshape(b, heads * chunks, rows, *x.shape[3:])

    subs = [sub_maps(x) for x in (s1, s2, v, ca, cb)]
    with torch.no_grad():
        out = dense(*subs, caller)
    out = out.reshape(b * heads, chunks * rows, w, c)[:, :h].contiguous()
    if chunks > 1:
        bounds = [(r0, min(r0 + rows, h)) for r0 in range(0, h, rows)]
        state = torch.empty(b * heads, w, d, c, device=s1.device, dtype=torch.float32)  # the one rolling state
        flat = [x.reshape(b * heads, *x.shape[2:]) for x in (s1, s2, v, ca, cb)]
        lp.run(pass_launches(*flat, out, state, bounds, lp.capability(s1.device)))
    return out.reshape(b, heads, h, w, c)


def _forward(s1, s2, v, la, lb, form: str, rows: Optional[int], dense: Callable, caller: Caller) -> torch.Tensor:
    """The chunked form on float32 contiguous inputs: V2H on the map, H2V as V2H on the transposed map."""
    ca, cb = la.cumsum(-1), lb.cumsum(-2)
    out = None
    for path in paths(form):
        if path == 'v2h':
            part = _v2h(s1, s2, v, ca.contiguous(), cb.contiguous(), rows or CHUNK_ROWS, dense, caller)
        else:
            def t(x):
                return x.transpose(2, 3).contiguous()
            part = _v2h(t(s1), t(s2), t(v), cb.transpose(-1, -2).contiguous(), ca.transpose(-1, -2).contiguous(),
                        rows or CHUNK_ROWS, dense, caller).transpose(2, 3)
        out = part if out is None else out + part
    return out


class _ChunkedTriton(torch.autograd.Function):
    """The Triton chunked form as one autograd node that saves its inputs only: ds1, ds2 and dv are the form on
    other operands (the mask transposed for ds2 and dv), the log-decays' gradients the torch chunked form's."""

    @staticmethod
    def forward(ctx, s1, s2, v, la, lb, form, rows, dense, caller):
        ctx.save_for_backward(s1, s2, v, la, lb)
        ctx.args = (rows, dense, caller)
        ctx.form = form
        try:
            return _forward(s1, s2, v, la, lb, form, *ctx.args)
        except Exception as e:
            raise_named(caller, 'while running', e)

    @staticmethod
    def backward(ctx, g):
        s1, s2, v, la, lb = ctx.saved_tensors
        form, args, caller = ctx.form, ctx.args, ctx.args[-1]
        back = transposed(form)
        need = ctx.needs_input_grad
        g = g.float().contiguous()
        try:
            ds1 = _forward(g, v, s2, la, lb, form, *args) if need[0] else None  # ((g v^T) * L) s2
            ds2 = _forward(v, g, s1, la, lb, back, *args) if need[1] else None  # ((v g^T) * L^T) s1
            dv = _forward(s2, s1, g, la, lb, back, *args) if need[2] else None  # ((s2 s1^T) * L^T) g
        except Exception as e:
            raise_named(caller, 'in the backward', e)
        if lp.is_recording():  # the torch part launches no kernel: shapes only
            dla, dlb = (torch.empty_like(t) if n else None for t, n in ((la, need[3]), (lb, need[4])))
        else:
            dla, dlb = decay_gradients(g, s1, s2, v, la, lb, form, None, need[3], need[4])
        return ds1, ds2, dv, dla, dlb, None, None, None, None


def chunked_triton(s1, s2, v, la, lb, form: str, dense: Callable, rows: Optional[int] = None,
                   caller: Optional[Caller] = None) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` by the chunked form's Triton kernels, in float32: s1, s2 (B, heads, H, W, d), v
    (B, heads, H, W, c), la, lb (B, heads, H, W) log-decays. ``dense(s1, s2, v, ca, cb, caller)``: V2H's dense
    kernel on float32 sub-maps and their tables (:func:`~.triton_impl.dense_v2h`); ``rows``: the rows of a chunk
    (None: :data:`CHUNK_ROWS`), of the map for V2H and of the transposed map for H2V; ``caller``: what errors
    name."""
    check_choice('form', form, MASK_FORMS)
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ValueError(f'rows: the rows of a chunk must be a positive int (or None: chosen); got {rows!r}')
    if s1.dim() != 5 or s2.shape != s1.shape or v.shape[:-1] != s1.shape[:-1] or la.shape != s1.shape[:-1] \
            or lb.shape != la.shape:
        raise ValueError(f'chunked_triton: s1, s2 (B, heads, H, W, d), v (B, heads, H, W, c), la, lb (B, heads, H, W)'
                         f'; got {tuple(s1.shape)}, {tuple(s2.shape)}, {tuple(v.shape)}, {tuple(la.shape)}, '
                         f'{tuple(lb.shape)}')
    caller = caller or Caller.of('chunked_triton', s1)
    if s1.shape[2] * s1.shape[3] == 0:
        return v.new_zeros(v.shape, dtype=torch.float32)
    tensors = [t.float().contiguous() for t in (s1, s2, v, la, lb)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _ChunkedTriton.apply(*tensors, form, rows, dense, caller)
    try:
        return _forward(*tensors, form, rows, dense, caller)
    except Exception as e:
        raise_named(caller, 'while running', e)


# ------------------------------------------------------------------------------------------------------------------
# Counting, per token of one image and head, one product with s1, s2 of d and v of c channels.


def chunked_triton_counts(h: int, w: int, d: int, c: int, form: str = 'v2h', rows: int = CHUNK_ROWS) -> float:
    """Multiply-adds per token of this form, the passes' weighted by :data:`PASS_WEIGHT`: per path (V2H on the map,
    H2V on the transposed one) the dense kernel on R x W sub-maps, ``R W (d + c)``, and with more than one chunk
    two passes, each per token 4 d c on the query side (the decay of the state, two sweeps, the contraction) and
    d c into the state, plus d c per column and chunk for moving the state."""
    check_choice('form', form, MASK_FORMS)
    if h < 1 or w < 1 or rows < 1:
        raise ValueError(f'chunked_triton_counts: H, W and rows must be positive; got {h}, {w}, {rows}')
    total = 0.0
    for path in paths(form):
        hh, ww = (h, w) if path == 'v2h' else (w, h)
        r = min(rows, hh)
        total += r * ww * (d + c)
        if r < hh:
            total += PASS_WEIGHT * 2 * (5 * d * c + d * c / r)
    return total


def uses_chunked_triton(h: int, w: int, d: int, c: int, form: str, rows: int = CHUNK_ROWS) -> bool:
    """Whether the Triton path runs the chunked form on an H x W map: where its weighted count
    (:func:`chunked_triton_counts`) times :data:`MARGIN` is below the dense kernels' ``N (d + c)`` multiply-adds
    per token (:func:`~.chunked.dense_counts`)."""
    return MARGIN * chunked_triton_counts(h, w, d, c, form, rows) < dense_counts(h, w, d, c, form).macs
