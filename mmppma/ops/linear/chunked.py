"""PPMLA and PPMDA, chunked form: ``((s1 s2^T) * L) v`` with work and memory linear in N (docs/method.md §5).

The map is cut into chunks of full rows; a map wider than tall is transposed first (its rows become the short
side), which swaps V2H and H2V. A polyline path between two tokens of one chunk stays inside it, so the intra-chunk
part is the dense op on the chunk. Between chunks a rolling state per column (W x d x c per image and head) carries
the keys of the earlier chunks to the corner row just above the chunk: the down pass walks the chunks top to
bottom, the up pass is the same walk on the map flipped upside down (its vertical log-decays shifted by one row).

* V2H, key (k, l) to query (i, j): down column l to the corner row, on to row i, then along row i to column j. State
  ``S[l] = sum_k exp(Cb[corner, l] - Cb[k, l]) s2_kl (x) v_kl``; the query side decays S to each of its rows and
  runs the row scan (:func:`~mmppma.ops.scan.torch_impl.decay_scan_torch`) of the decayed states: O(d c) per token.
* H2V, key (k, l) to query (i, j): along row k to column j, then down column j. The key side runs the row scan of
  ``s2 (x) v`` per key row before the state takes it; the query side is one decay and a contraction per token.

The counting functions below count this form's and the dense form's multiply-adds and exponentials per token and
their largest intermediate, and choose the chunk rows and the scan block that minimise the counted work.
"""
import functools
import math
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from mmppma.utils.checks import check_choice

from ..checks import table_dtype
from ..forms import MASK_FORMS, paths, transposed
from ..scan.torch_impl import decay_scan_torch
from .reference import decomposed_reference

Bounds = List[Tuple[int, int]]


def transposes(h: int, w: int) -> bool:
    """Whether the chunked form runs on the transposed map: when it is wider than tall (rows are the short side)."""
    return w > h


def chunked(s1, s2, v, la, lb, form: str, rows: Optional[int] = None) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` chunk by chunk, computed in float32 (float64 for float64 inputs); s1, s2
    (B, heads, H, W, r), v (B, heads, H, W, c), la, lb (B, heads, H, W). ``rows``: the rows of a chunk of the map as
    chunked (transposed when wider than tall); None: :func:`chunk_rows`. Under autograd the backward saves the
    inputs only (:class:`_Chunked`)."""
    check_choice('form', form, MASK_FORMS)
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ValueError(f'rows: the rows of a chunk must be a positive int (or None: chosen); got {rows!r}')
    tensors = (s1, s2, v, la, lb)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _Chunked.apply(*tensors, form, rows)
    return _forward(*tensors, form, rows)


class _Chunked(torch.autograd.Function):
    """The chunked form as one autograd node that saves its inputs only. The op is linear in each of s1, s2 and v,
    so their gradients are the form itself on other operands (the mask transposed for s2 and v); the log-decays'
    come from the form recomputed under autograd inside the backward, whose tensors live only while it runs."""

    @staticmethod
    def forward(ctx, s1, s2, v, la, lb, form, rows):
        ctx.save_for_backward(s1, s2, v, la, lb)
        ctx.form, ctx.rows = form, rows
        return _forward(s1, s2, v, la, lb, form, rows)

    @staticmethod
    def backward(ctx, g):
        s1, s2, v, la, lb = ctx.saved_tensors
        form, rows = ctx.form, ctx.rows
        back = transposed(form)  # the form of the transposed mask L^T
        need = ctx.needs_input_grad
        ds1 = _forward(g, v, s2, la, lb, form, rows).to(s1.dtype) if need[0] else None  # ((g v^T) * L) s2
        ds2 = _forward(v, g, s1, la, lb, back, rows).to(s2.dtype) if need[1] else None  # ((v g^T) * L^T) s1
        dv = _forward(s2, s1, g, la, lb, back, rows).to(v.dtype) if need[2] else None  # ((s2 s1^T) * L^T) g
        dla, dlb = decay_gradients(g, s1, s2, v, la, lb, form, rows, need[3], need[4])
        return ds1, ds2, dv, dla, dlb, None, None


def decay_gradients(g, s1, s2, v, la, lb, form: str, rows: Optional[int], need_la: bool, need_lb: bool):
    """(dla, dlb) of ``<g, chunked(s1, s2, v, la, lb)>``, each None unless needed: the chunked form recomputed under
    autograd on detached inputs, its tensors alive only while this runs."""
    if not (need_la or need_lb):
        return None, None
    with torch.enable_grad():
        tables = [t.detach().requires_grad_(n) for t, n in ((la, need_la), (lb, need_lb))]
        out = _forward(s1.detach(), s2.detach(), v.detach(), *tables, form, rows)
        grads = iter(torch.autograd.grad(out, [t for t in tables if t.requires_grad], g.to(out.dtype)))
    return tuple(next(grads) if n else None for n in (need_la, need_lb))


def _forward(s1, s2, v, la, lb, form: str, rows: Optional[int]) -> torch.Tensor:
    """:func:`chunked` on checked arguments."""
    h, w = s1.shape[-3:-1]
    if h * w == 0:  # no tokens: nothing to attend
        return v.new_zeros(v.shape).to(table_dtype(s1, s2, v))
    if transposes(h, w):
        out = _forward(*(t.transpose(-3, -2) for t in (s1, s2, v)), lb.transpose(-1, -2), la.transpose(-1, -2),
                       transposed(form), rows)
        return out.transpose(-3, -2)
    rows = rows or chunk_rows(h, w, s1.shape[-1], v.shape[-1], form)
    dtype = table_dtype(s1, s2, v, la, lb)
    s1, s2, v, la, lb = (t.to(dtype) for t in (s1, s2, v, la, lb))
    bounds = [(r0, min(r0 + rows, h)) for r0 in range(0, h, rows)]
    block = scan_block(w, s1.shape[-1] * v.shape[-1])
    out = torch.cat([decomposed_reference(s1[..., r0:r1, :, :], s2[..., r0:r1, :, :], v[..., r0:r1, :, :],
                                          la[..., r0:r1, :], lb[..., r0:r1, :], form) for r0, r1 in bounds], -3)
    if len(bounds) == 1:
        return out
    # the up pass: the down pass on the map upside down, where a column segment sums the log-decays of the rows
    # from min up to max - 1 (shifted by one row), and the chunks keep their rows
    flipped = [t.flip(-3) for t in (s1, s2, v)] + [la.flip(-2), F.pad(lb.flip(-2)[..., :-1, :], (0, 0, 1, 0))]
    flipped_bounds = [(h - r1, h - r0) for r0, r1 in reversed(bounds)]
    for path in paths(form):
        out = out + _down_pass(s1, s2, v, la, lb, bounds, path, block)
        out = out + _down_pass(*flipped, flipped_bounds, path, block).flip(-3)
    return out


def _down_pass(s1, s2, v, la, lb, bounds: Bounds, path: str, block: int) -> torch.Tensor:
    """What each query takes from the keys of the chunks above its own (``bounds``: the chunks top to bottom) on
    ``path``: (B, heads, H, W, c)."""
    cb = F.pad(lb.cumsum(-2), (0, 0, 1, 0))  # cb[r + 1] = Cb[r]; cb[0] = 0, the table above row 0
    out, state = [], None
    for n, (r0, r1) in enumerate(bounds):
        corner = cb[..., r0, :]  # Cb at the row above the chunk: (B, heads, W)
        chunk_cb = cb[..., r0 + 1:r1 + 1, :]  # (B, heads, R, W)
        s1c, s2c, vc, lac = s1[..., r0:r1, :, :], s2[..., r0:r1, :, :], v[..., r0:r1, :, :], la[..., r0:r1, :]
        if state is None:
            out.append(vc.new_zeros(*s1c.shape[:-1], vc.shape[-1]))
        else:  # the state decayed from the corner down to each query row
            decay = (chunk_cb - corner.unsqueeze(-2)).exp()
            out.append(_v2h_queries(state, decay, s1c, lac, block) if path == 'v2h' else
                       ((decay.unsqueeze(-1) * s1c).unsqueeze(-2) @ state.unsqueeze(-4)).squeeze(-2))
        if n + 1 == len(bounds):
            break
        last = cb[..., r1, :]  # the next chunk's corner: this chunk's last row
        weight = (last.unsqueeze(-2) - chunk_cb).exp()  # each key row down to it
        if path == 'v2h':
            add = torch.einsum('...klr,...klc->...lrc', weight.unsqueeze(-1) * s2c, vc)
        else:  # each key carried along its row first
            kv = (s2c.unsqueeze(-1) * vc.unsqueeze(-2)).flatten(-2)
            add = (weight.unsqueeze(-1) * decay_scan_torch(kv, lac, block)).sum(-3)
            add = add.unflatten(-1, (s2c.shape[-1], vc.shape[-1]))
        state = add if state is None else (last - corner).exp()[..., None, None] * state + add
    return torch.cat(out, -3)


def _v2h_queries(state, decay, s1c, lac, block: int) -> torch.Tensor:
    """V2H's query side: per query row, the states decayed to that row, scanned along it, contracted with s1."""
    x = (decay[..., None, None] * state.unsqueeze(-4)).flatten(-2)  # (B, heads, R, W, r * c)
    y = decay_scan_torch(x, lac, block).unflatten(-1, state.shape[-2:])
    return (s1c.unsqueeze(-2) @ y).squeeze(-2)


# ------------------------------------------------------------------------------------------------------------------
# Counting: per token of one image and head, for one product ((s1 s2^T) * L) v with s1, s2 of d and v of c channels
# (PPMLA with a normalizer is two: (d, c) and (d, 1)); intermediates in elements times ``itemsize`` bytes.


class Counts(NamedTuple):
    """Multiply-adds and exponentials per token, and the bytes of the largest intermediate per image and head besides
    those of the map's size (copies of the inputs, the decay tables, the output)."""
    macs: float
    exps: float
    largest: int


def dense_counts(h: int, w: int, d: int, c: int, form: str = 'v2h', itemsize: int = 4) -> Counts:
    """The dense form (fused flash-style or reference): every query meets every key, d multiply-adds for the score
    and c for the output; one exponential per score and path. Largest intermediate: the N x N mask of the
    reference (the fused kernels hold tiles only)."""
    n = h * w
    return Counts(n * (d + c), n * len(paths(form)), n * n * itemsize)


def scan_counts(length: int, depth: int, block: int) -> Tuple[int, int, int]:
    """(multiply-adds, exponentials, largest elements) of one line of :func:`decay_scan_torch` with ``chunk=block``
    on ``depth`` channels: one dense tile when the line fits the block, else two causal chunkwise scans (tiles,
    the states leaving the blocks, the scan across blocks, the states entering them)."""
    if length <= block:
        return length * length * depth, length * length, max(length * length, length * depth)
    n = -(-length // block)
    terms = n * block * block + 2 * n * block + n * n  # tiles, leaving and entering states, across
    return 2 * terms * depth, 2 * terms, max(n * block * depth, n * block * block, n * n)


@functools.lru_cache(maxsize=256)
def scan_block(length: int, depth: int) -> int:
    """The block of the row scans that minimises their counted multiply-adds (the whole line: one dense tile)."""
    blocks = [2 ** k for k in range(1, max(1, length - 1).bit_length())] + [length]
    return min(blocks, key=lambda b: (scan_counts(length, depth, b)[0], -b))


def _pass_counts(sizes: List[int], w: int, d: int, c: int, path: str) -> Tuple[int, int, int]:
    """(multiply-adds, exponentials, largest elements) of one pass over chunks of ``sizes`` rows, in pass order."""
    dc = d * c
    block = scan_block(w, dc)
    line_macs, line_exps, line_largest = scan_counts(w, dc, block)
    macs = exps = largest = 0
    for n, r in enumerate(sizes):
        tokens = r * w
        if n:  # the query side (the first chunk has no state)
            exps += tokens
            if path == 'v2h':  # decay the states to each row, scan them along it, contract with s1
                macs += 2 * tokens * dc + r * line_macs
                exps += r * line_exps
                largest = max(largest, tokens * dc, r * line_largest)
            else:  # one decay per query, then the contraction
                macs += tokens * d + tokens * dc
        if n + 1 < len(sizes):  # the state takes the chunk's keys (the last chunk's are not needed)
            exps += tokens
            if path == 'v2h':
                macs += tokens * d + tokens * dc
            else:  # the outer products, scanned along their rows, weighted into the state
                macs += 2 * tokens * dc + r * line_macs
                exps += r * line_exps
                largest = max(largest, tokens * dc, r * line_largest)
            if n:  # the state decayed across the chunk
                macs += w * dc
                exps += w
            largest = max(largest, w * dc)
    return macs, exps, largest


def chunked_counts(h: int, w: int, d: int, c: int, rows: int, form: str = 'v2h', itemsize: int = 4) -> Counts:
    """The chunked form as :func:`chunked` runs it on an H x W map in chunks of ``rows`` rows of the map as chunked
    (:func:`oriented`): the dense op inside the chunks, and per path a down and an up pass."""
    check_choice('form', form, MASK_FORMS)
    if rows < 1 or h < 1 or w < 1:
        raise ValueError(f'chunked_counts: H, W and rows must be positive; got {h}, {w}, {rows}')
    if transposes(h, w):
        h, w, form = w, h, transposed(form)
    sizes = [min(rows, h - r0) for r0 in range(0, h, rows)]
    macs = sum((r * w) ** 2 * (d + c) for r in sizes)
    exps = sum((r * w) ** 2 for r in sizes) * len(paths(form))
    largest = max((r * w) ** 2 for r in sizes)
    if len(sizes) > 1:
        for path in paths(form):
            for order in (sizes, sizes[::-1]):
                m, e, big = _pass_counts(order, w, d, c, path)
                macs, exps, largest = macs + m, exps + e, max(largest, big)
    return Counts(macs / (h * w), exps / (h * w), largest * itemsize)


@functools.lru_cache(maxsize=256)
def chunk_rows(h: int, w: int, d: int, c: int, form: str = 'v2h') -> int:
    """The rows of a chunk (of the map as chunked, :func:`oriented`) that minimise :func:`chunked_counts`'
    multiply-adds on an H x W map, then its exponentials, then the larger chunk."""
    return min(range(1, max(h, w) + 1), key=lambda r: (*chunked_counts(h, w, d, c, r, form)[:2], -r))


def oriented(h: int, w: int) -> Tuple[int, int]:
    """The map's (H, W) as the chunked form runs it (:func:`transposes`)."""
    return (w, h) if transposes(h, w) else (h, w)


def linear_counts(h: int, w: int, d: int, c: int, form: str = 'v2h', itemsize: int = 4) -> Tuple[Counts, Counts]:
    """(dense, chunked) counts of PPMLA with a normalizer of its own (two products: (d, c) and (d, 1)), the chunked
    form at the chunk rows it chooses for each product."""
    dense = [dense_counts(h, w, d, cc, form, itemsize) for cc in (c, 1)]
    chunk = [chunked_counts(h, w, d, cc, chunk_rows(h, w, d, cc, form), form, itemsize) for cc in (c, 1)]
    return tuple(Counts(a.macs + b.macs, a.exps + b.exps, max(a.largest, b.largest)) for a, b in (dense, chunk))


def field_bytes(h: int, w: int, d: int, c: int, itemsize: int = 4) -> int:
    """Bytes of the per-token field of d x c states that Theorem 3's scan form holds (per image and head)."""
    return h * w * d * c * itemsize


def budget_ratio(h: int, w: int, d: int, c: int, reference: Tuple[int, int] = (56, 56)) -> float:
    """The chunked PPMLA's counted multiply-adds per token over the dense form's ``N (2 d + c)`` at ``reference``."""
    return linear_counts(h, w, d, c)[1].macs / (math.prod(reference) * (2 * d + c))


#: the maps of the budget table: the 56 x 56 reference (MLLA-T's stage 1) and detection stage-1 maps
TABLE_MAPS = ((56, 56), (128, 128), (100, 168), (200, 336))


def budget_table(d: int = 32, c: int = 32, maps=TABLE_MAPS) -> str:
    """The counted work of PPMLA with its own normalizer, one path, dense and chunked, as a markdown table: per token
    multiply-adds and exponentials, the chunked one's multiply-adds over the dense form's ``N (2 d + c)`` at 56 x 56,
    and the largest intermediate (MiB per image and head, float32) against Theorem 3's N x d x c field."""
    lines = ['| map | chunked as | rows (out, mass) | scan block | dense MACs | chunked MACs | / 3136 (2d + c) | '
             'dense exps | chunked exps | largest (MiB) | field (MiB) |', '|' + ' --- |' * 11]
    for h, w in maps:
        hh, ww = oriented(h, w)
        dense, chunk = linear_counts(h, w, d, c)
        rows = f'{chunk_rows(h, w, d, c)}, {chunk_rows(h, w, d, 1)}'
        lines.append(f'| {h} x {w} | {hh} x {ww} | {rows} | {scan_block(ww, d * c)} | {dense.macs:,.0f} | '
                     f'{chunk.macs:,.0f} | {budget_ratio(h, w, d, c):.2f} | {dense.exps:,.0f} | {chunk.exps:,.0f} | '
                     f'{chunk.largest / 2 ** 20:.2f} | {field_bytes(h, w, d, c) / 2 ** 20:.0f} |')
    return '\n'.join(lines)
