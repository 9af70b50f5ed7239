"""PPMLA and PPMDA, the chunked form on the Triton path: ``((s1 s2^T) * L) v`` with work and memory linear in N
(docs/method.md §5), in float32; the host side (the kernels: :mod:`.chunked_passes`).

Only V2H runs here; H2V is V2H on the transposed map (rows and columns swapped, la and lb swapped), '2d' the sum of
both. A V2H path cuts the map into chunks of R full rows. Inside a chunk the dense fused kernels (:class:`Dense`,
handed in by the caller) run on the chunks as a batch of R x W sub-maps; between chunks the passes' walks carry
the keys (and in the backward the queries) of the other chunks in one (B * heads, W, d, c) float32 state buffer
per call.

:class:`_ChunkedTriton` is one autograd node that saves its inputs only: its backward takes the gradients of the
pairs inside a chunk from the dense kernels' backward on the sub-maps and those of the pairs between chunks,
log-decays included, from the walks. :func:`uses_chunked_triton` is the crossover against the dense kernels.
"""
from typing import List, Optional

import torch

from mmppma.utils.checks import check_choice

from ..forms import MASK_FORMS, paths
from ..triton_support import launch as lp
from ..triton_support.calls import Caller, raise_named
from . import chunked_passes as passes
from .chunked import TABLE_MAPS, dense_counts
from .chunked_passes import Bounds

#: the rows of a chunk: the chunk's own keys cost 2 R d c per token; fewer rows add launches (four per chunk and path)
#: and narrow the query launches (R programs per image, head and value block)
CHUNK_ROWS = 16
#: weight of this form's multiply-adds against the dense kernels': its sequential row sweeps in one-row programs run
#: on the FMA units in float32, the dense kernels' products on tensor cores in the inputs' precision
PASS_WEIGHT = 4
#: the chunked form runs where its weighted count is below the dense form's by this factor: it pays a host loop and
#: 4 launches per chunk and path that the count does not see
MARGIN = 2


def _bounds(h: int, rows: int) -> Bounds:
    """The chunks of ``rows`` rows of a map of ``h`` rows, top to bottom."""
    return [(r0, min(r0 + rows, h)) for r0 in range(0, h, rows)]


def _flat(*tensors: torch.Tensor) -> List[torch.Tensor]:
    """(B, heads, ...) -> (B * heads, ...)."""
    return [x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]) for x in tensors]


def _v2h(s1, s2, v, ca, cb, rows: int) -> torch.Tensor:
    """V2H's product on (B, heads, H, W, .) float32 contiguous inputs and tables (B, heads, H, W) in chunks of
    ``rows`` rows; float32 (B, heads, H, W, c)."""
    b, heads, h, w, d = s1.shape
    c = v.shape[-1]
    f32 = dict(device=s1.device, dtype=torch.float32)
    out = torch.zeros(b * heads, h, w, c, **f32)
    state = torch.empty(b * heads, w, d, c, **f32)  # the one rolling state
    lp.run(passes.pass_launches(*_flat(s1, s2, v, ca, cb), out, state, _bounds(h, rows), lp.capability(s1.device)))
    return out.reshape(b, heads, h, w, c)


def _v2h_grads(g, s1, s2, v, ca, cb, rows: int) -> List[torch.Tensor]:
    """The gradients of ``<g, V2H's product>`` (:func:`_v2h`'s arguments): ds1, ds2, dv (B, heads, H, W, .) and
    the node gradients dCa, dCb (B, heads, H, W), float32."""
    b, heads, h, w, d = s1.shape
    c = v.shape[-1]
    rows = min(rows, h)
    f32 = dict(device=s1.device, dtype=torch.float32)
    blocks = lp.cdiv(c, passes.block_c(c))
    state, u = (torch.empty(b * heads, w, d, c, **f32) for _ in range(2))
    qbuf = torch.empty(b * heads, rows, w, d, c, **f32)
    ds1, ds2 = (torch.zeros(blocks, b * heads, h, w, d, **f32) for _ in range(2))
    dv = torch.zeros(b * heads, h, w, c, **f32)
    node = torch.zeros(blocks, 2, 2, b * heads, h, w, **f32)  # (block, sweep, Ca or Cb, ...)
    lp.run(passes.grad_launches(*_flat(g, s1, s2, v, ca, cb), state, u, qbuf, ds1, ds2, dv, node, _bounds(h, rows),
                                lp.capability(s1.device)))
    dca, dcb = node.sum((0, 1))
    return [x.reshape(b, heads, *x.shape[1:]) for x in (ds1.sum(0), ds2.sum(0), dv, dca, dcb)]


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """The map transposed: (B, heads, H, W, ...) -> (B, heads, W, H, ...), contiguous."""
    return x.transpose(2, 3).contiguous()


def _forward(s1, s2, v, la, lb, form: str, rows: Optional[int]) -> torch.Tensor:
    """The chunked form on float32 contiguous inputs: V2H on the map, H2V as V2H on the transposed map."""
    ca, cb = la.cumsum(-1), lb.cumsum(-2)
    rows = rows or CHUNK_ROWS
    out = None
    for path in paths(form):
        if path == 'v2h':
            part = _v2h(s1, s2, v, ca.contiguous(), cb.contiguous(), rows)
        else:
            part = _v2h(*map(_transposed, (s1, s2, v, cb, ca)), rows).transpose(2, 3)
        out = part if out is None else out + part
    return out


def _backward(g, s1, s2, v, la, lb, form: str, rows: Optional[int]):
    """The gradients of ``<g, _forward(...)>``: ds1, ds2, dv, dla, dlb, float32."""
    ca, cb = la.cumsum(-1), lb.cumsum(-2)
    rows = rows or CHUNK_ROWS
    total = None
    for path in paths(form):
        if path == 'v2h':
            part = _v2h_grads(g, s1, s2, v, ca.contiguous(), cb.contiguous(), rows)
        else:  # back to the map: the transposed map's tables are (Cb, Ca) transposed
            ds1, ds2, dv, dcb, dca = _v2h_grads(*map(_transposed, (g, s1, s2, v, cb, ca)), rows)
            part = [x.transpose(2, 3) for x in (ds1, ds2, dv, dca, dcb)]
        total = part if total is None else [x + y for x, y in zip(total, part)]
    ds1, ds2, dv, dca, dcb = total
    # Ca = cumsum(la) along a row, Cb = cumsum(lb) along a column: each log-decay takes the node gradients from it on
    return ds1, ds2, dv, _suffix_sums(dca, -1), _suffix_sums(dcb, -2)


def _suffix_sums(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.flip(dim).cumsum(dim).flip(dim)


class _ChunkedTriton(torch.autograd.Function):
    """The Triton chunked form as one autograd node that saves its inputs only; its backward recomputes the walks."""

    @staticmethod
    def forward(ctx, s1, s2, v, la, lb, form, rows, caller):
        ctx.save_for_backward(s1, s2, v, la, lb)
        ctx.args = (form, rows)
        ctx.caller = caller
        try:
            return _forward(s1, s2, v, la, lb, *ctx.args)
        except Exception as e:
            raise_named(caller, 'while running', e)

    @staticmethod
    def backward(ctx, g):
        try:
            grads = _backward(g.float().contiguous(), *ctx.saved_tensors, *ctx.args)
        except Exception as e:
            raise_named(ctx.caller, 'in the backward', e)
        return (*(x if need else None for x, need in zip(grads, ctx.needs_input_grad)), None, None, None)


def chunked_triton(s1, s2, v, la, lb, form: str, rows: Optional[int] = None,
                   caller: Optional[Caller] = None) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` by the chunked form's Triton kernels, in float32: s1, s2 (B, heads, H, W, d), v
    (B, heads, H, W, c), la, lb (B, heads, H, W) log-decays; ``rows``: the rows of a chunk
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
        return _ChunkedTriton.apply(*tensors, form, rows, caller)
    try:
        return _forward(*tensors, form, rows)
    except Exception as e:
        raise_named(caller, 'while running', e)


# ------------------------------------------------------------------------------------------------------------------
# Counting, per token of one image and head, one product with s1, s2 of d and v of c channels.


def _path_rows(h: int, w: int, form: str) -> List[int]:
    """The rows each path chunks: the map's for V2H, the transposed map's (W) for H2V."""
    return [h if path == 'v2h' else w for path in paths(form)]


def chunked_triton_macs(h: int, w: int, d: int, c: int, form: str = 'v2h', rows: int = CHUNK_ROWS) -> float:
    """Multiply-adds per token of this form's forward, as its launches run them: per path (H' rows of W' tokens in
    chunks of R rows) each query row sweeps its W' columns twice, each step ``R_n d c`` for its chunk's own R_n keys
    (down walk), ``2 d c`` for the scan and the contraction and ``d c`` for a state decayed to the row (every
    visit but a walk's first); each state update adds its chunk's rows (``d c`` per token) and decays the state it
    holds (``d c`` per column)."""
    check_choice('form', form, MASK_FORMS)
    if h < 1 or w < 1 or rows < 1:
        raise ValueError(f'chunked_triton_macs: H, W and rows must be positive; got {h}, {w}, {rows}')
    dc = d * c
    total = 0.0
    for hh in _path_rows(h, w, form):
        ww = h * w // hh
        sizes = [r1 - r0 for r0, r1 in _bounds(hh, rows)]
        last = len(sizes) - 1
        macs = sum(r * ww * 2 * (r * dc + 2 * dc + (n > 0) * dc) for n, r in enumerate(sizes))  # down walk
        macs += sum(r * ww * 2 * 3 * dc for r in sizes[:last])  # up walk, all but its first chunk
        macs += sum(r * ww * dc for r in sizes[:last] + sizes[1:]) if last else 0  # updates: the chunk's rows
        macs += 2 * max(last - 1, 0) * ww * dc  # and the state they hold
        total += macs / (h * w)
    return total


def forward_launches(h: int, w: int, form: str = 'v2h', rows: int = CHUNK_ROWS) -> int:
    """The forward's launches for one product: per path with C chunks, ``2 C - 1`` query launches and ``2 (C - 1)``
    state updates."""
    return sum(4 * lp.cdiv(hh, min(rows, hh)) - 3 for hh in _path_rows(h, w, form))


def uses_chunked_triton(h: int, w: int, d: int, c: int, form: str, rows: int = CHUNK_ROWS) -> bool:
    """Whether the Triton path runs the chunked form on an H x W map: where its multiply-adds per token
    (:func:`chunked_triton_macs`) weighted by :data:`PASS_WEIGHT` and :data:`MARGIN` are below the dense kernels'
    ``N (d + c)`` (:func:`~.chunked.dense_counts`)."""
    return MARGIN * PASS_WEIGHT * chunked_triton_macs(h, w, d, c, form, rows) < dense_counts(h, w, d, c, form).macs


def budget_table(d: int = 32, c: int = 32, form: str = '2d', maps=TABLE_MAPS) -> str:
    """The counted work of the Triton path's PPMLA with its own normalizer (the products (d, c) and (d, 1)) as a
    markdown table: per token multiply-adds of the dense kernels (``N (2 d + c + 1)``) and of this form, this
    form's over ``N (2 d + c)`` at 56 x 56, the form the plan chooses and the forward's launches."""
    base = 56 * 56 * (2 * d + c)
    lines = ['| map | chunks (V2H, H2V) | dense MACs | chunked MACs | / 3136 (2d + c) | chosen | forward launches |',
             '|' + ' --- |' * 7]
    for h, w in maps:
        dense = dense_counts(h, w, d, c, form).macs + dense_counts(h, w, d, 1, form).macs
        chunked = chunked_triton_macs(h, w, d, c, form) + chunked_triton_macs(h, w, d, 1, form)
        chunks = ', '.join(str(lp.cdiv(hh, min(CHUNK_ROWS, hh))) for hh in _path_rows(h, w, form))
        chosen = 'chunked' if uses_chunked_triton(h, w, d, c, form) else 'dense'
        launches = 2 * forward_launches(h, w, form) if chosen == 'chunked' else 1
        lines.append(f'| {h} x {w} | {chunks} | {dense:,.0f} | {chunked:,.0f} | {chunked / base:.2f} | {chosen} | '
                     f'{launches} |')
    return '\n'.join(lines)
