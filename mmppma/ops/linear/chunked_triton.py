"""PPMLA and PPMDA, the chunked form on the Triton path: ``((s1 s2^T) * L) v`` with work and memory linear in N
(docs/method.md §5), computed in float32 from inputs of any float dtype; the host side (the kernels:
:mod:`.chunked_passes`).

Only V2H has kernels; H2V is V2H on the transposed map (rows and columns swapped by the kernels' token strides, la
and lb swapped), '2d' both into one output. A V2H path cuts the map into chunks of R full rows: each chunk's query
rows meet its own keys in the query kernels, and the walks carry the keys (and in the backward the queries) of the
other chunks in rolling per-column states, one max(H, W) x d x c buffer per image and head for both paths.

:class:`_ChunkedTriton` is one autograd node (normalized by a mass product for PPMLA) that saves its inputs only;
its backward runs the walks again for every gradient, the log-decays' included. :func:`uses_chunked_triton` is the
crossover against the dense kernels.
"""
from typing import List, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from mmppma.utils.checks import check_choice

from ..forms import MASK_FORMS, paths
from ..triton_support import launch as lp
from ..triton_support.calls import Caller, raise_named
from . import chunked_passes as passes
from .chunked import TABLE_MAPS, dense_counts
from .chunked_passes import Layout

#: the rows of a chunk: the chunk's own keys cost 2 R d c per token; fewer rows add launches (four per chunk and path)
#: and narrow the query launches (R programs per image, head and value block)
CHUNK_ROWS = 16
#: weight of this form's multiply-adds against the dense kernels': its sequential row sweeps in one-row programs run
#: on the FMA units in float32, the dense kernels' products on tensor cores in the inputs' precision
PASS_WEIGHT = 4
#: the chunked form runs where its weighted count is below the dense form's by this factor: it pays a host loop and
#: 4 launches per chunk and path forward (8 backward) that the count does not see
MARGIN = 2


def _paths(s1: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, form: str) -> List[Tuple[Layout, tuple, tuple]]:
    """Per path of ``form``: the layout V2H's kernels walk (the map, or for H2V the transposed map), its (row,
    column) cumsum tables and the slots of their node gradients in the backward's (Ca, Cb) buffer."""
    ca, cb = la.cumsum(-1), lb.cumsum(-2)
    return [(passes.Layout.of(s1, True), (cb, ca), (1, 0)) if path == 'h2v' else
            (passes.Layout.of(s1, False), (ca, cb), (0, 1)) for path in paths(form)]


def _scratch(s1, v, rows: int, count: int) -> List[torch.Tensor]:
    """``count`` float32 buffers, each room for (B heads, rows, max(H, W), d, c): the states and the queries of a
    chunk, for either path."""
    b, heads, h, w, d = s1.shape
    size = b * heads * rows * max(h, w) * d * v.shape[-1]
    return [torch.empty(size, device=s1.device, dtype=torch.float32) for _ in range(count)]


def _forward(s1, s2, v, la, lb, form: str, rows: Optional[int]) -> torch.Tensor:
    """The chunked form on contiguous inputs (any float dtype) and float32 log-decays: V2H on the map, H2V as V2H on
    the transposed map (by strides), both into one float32 output."""
    rows = rows or CHUNK_ROWS
    out = torch.zeros(v.shape, device=v.device, dtype=torch.float32)
    state, = _scratch(s1, v, 1, 1)
    cap = lp.capability(s1.device)
    for layout, tables, _ in _paths(s1, la, lb, form):
        lp.run(passes.pass_launches(s1, s2, v, *tables, out, state, layout, rows, cap))
    return out


def _backward(g, s1, s2, v, la, lb, form: str, rows: Optional[int]):
    """The gradients of ``<g, _forward(...)>``: ds1, ds2, dv, dla, dlb, float32."""
    rows = rows or CHUNK_ROWS
    b, heads, h, w, d = s1.shape
    c = v.shape[-1]
    f32 = dict(device=s1.device, dtype=torch.float32)
    blocks = lp.cdiv(c, passes.block_c(c))
    state, u = _scratch(s1, v, 1, 2)
    qbuf, = _scratch(s1, v, min(rows, max(h, w)), 1)
    ds1, ds2 = (torch.zeros(blocks, *s1.shape, **f32) for _ in range(2))
    dv = torch.zeros(v.shape, **f32)
    node = torch.zeros(blocks, 2, 2, *la.shape, **f32)  # (block, sweep, Ca or Cb, ...)
    cap = lp.capability(s1.device)
    for layout, tables, kinds in _paths(s1, la, lb, form):
        lp.run(passes.grad_launches(g, s1, s2, v, *tables, state, u, qbuf, ds1, ds2, dv, node, layout,
                                    min(rows, layout.h), kinds, cap))
    dca, dcb = node.sum((0, 1))
    # Ca = cumsum(la) along a row, Cb = cumsum(lb) along a column: each log-decay takes the node gradients from it on
    return ds1.sum(0), ds2.sum(0), dv, _suffix_sums(dca, -1), _suffix_sums(dcb, -2)


def _suffix_sums(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.flip(dim).cumsum(dim).flip(dim)


def _normalized(s1, s2, v, qn, kn, la, lb, form: str, rows: Optional[int], eps: float):
    """(out, mass + eps): out the product of (s1, s2, v), mass that of (qn, kn, 1), float32."""
    out = _forward(s1, s2, v, la, lb, form, rows)
    return out, _forward(qn, kn, v.new_ones(*v.shape[:-1], 1), la, lb, form, rows).add_(eps)


def _product(s1, s2, v, la, lb, qn, kn, form: str, rows: Optional[int], eps: float) -> torch.Tensor:
    """The form's output, ``out / (mass + eps)`` when qn, kn are given."""
    if qn is None:
        return _forward(s1, s2, v, la, lb, form, rows)
    out, mass = _normalized(s1, s2, v, qn, kn, la, lb, form, rows, eps)
    return out.div_(mass)


class _ChunkedTriton(torch.autograd.Function):
    """The Triton chunked form (normalized by the mass of (qn, kn) when they are given) as one autograd node that
    saves its inputs only; its backward recomputes the product (and the mass) and runs the backward's walks."""

    @staticmethod
    def forward(ctx, s1, s2, v, la, lb, qn, kn, form, rows, eps, caller):
        ctx.save_for_backward(s1, s2, v, la, lb, qn, kn)
        ctx.args, ctx.eps, ctx.caller = (form, rows), eps, caller
        try:
            return _product(s1, s2, v, la, lb, qn, kn, form, rows, eps)
        except Exception as e:
            raise_named(caller, 'while running', e)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        s1, s2, v, la, lb, qn, kn = ctx.saved_tensors
        g = g.float().contiguous()
        try:
            if qn is None:
                grads = (*_backward(g, s1, s2, v, la, lb, *ctx.args), None, None)
            else:  # d(out / mass) = d(out) / mass - out d(mass) / mass^2
                out, mass = _normalized(s1, s2, v, qn, kn, la, lb, *ctx.args, ctx.eps)
                g = g / mass
                ds1, ds2, dv, dla, dlb = _backward(g, s1, s2, v, la, lb, *ctx.args)
                g = (g * out).sum(-1, keepdim=True).div_(mass).neg_()
                dqn, dkn, _, dla_mass, dlb_mass = _backward(g, qn, kn, v.new_ones(*v.shape[:-1], 1), la, lb,
                                                            *ctx.args)
                grads = (ds1, ds2, dv, dla + dla_mass, dlb + dlb_mass, dqn, dkn)
        except Exception as e:
            raise_named(ctx.caller, 'in the backward', e)
        return (*(x if need else None for x, need in zip(grads, ctx.needs_input_grad)), None, None, None, None)


def chunked_triton(s1, s2, v, la, lb, form: str, rows: Optional[int] = None, caller: Optional[Caller] = None,
                   normalizer: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, eps: float = 0.0) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` by the chunked form's Triton kernels, computed and returned in float32: s1, s2 (B,
    heads, H, W, d), v (B, heads, H, W, c) of any float dtype, la, lb (B, heads, H, W) log-decays; with
    ``normalizer`` (q', k', shaped as s1) divided by ``((q' k'^T) * L) 1 + eps``. ``rows``: the rows of a chunk
    (None: :data:`CHUNK_ROWS`), of the map for V2H and of the transposed map for H2V; ``caller``: what errors
    name."""
    check_choice('form', form, MASK_FORMS)
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ValueError(f'rows: the rows of a chunk must be a positive int (or None: chosen); got {rows!r}')
    if s1.dim() != 5 or s2.shape != s1.shape or v.shape[:-1] != s1.shape[:-1] or la.shape != s1.shape[:-1] \
            or lb.shape != la.shape or (normalizer is not None and any(t.shape != s1.shape for t in normalizer)):
        got = ', '.join(str(tuple(t.shape)) for t in (s1, s2, v, la, lb, *(normalizer or ())))
        extra = ", the normalizer's q', k' as s1" if normalizer is not None else ''
        raise ValueError(f'chunked_triton: s1, s2 (B, heads, H, W, d), v (B, heads, H, W, c), la, lb (B, heads, H, W)'
                         f'{extra}; got {got}')
    caller = caller or Caller.of('chunked_triton', s1)
    if s1.shape[2] * s1.shape[3] == 0:
        return v.new_zeros(v.shape, dtype=torch.float32)
    qn, kn = (t.contiguous() for t in normalizer) if normalizer is not None else (None, None)
    tensors = [t.contiguous() for t in (s1, s2, v)] + [t.float().contiguous() for t in (la, lb)] + [qn, kn]
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return _ChunkedTriton.apply(*tensors, form, rows, eps, caller)
    try:
        return _product(*tensors, form, rows, eps)
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
        sizes = [min(rows, hh - r0) for r0 in range(0, hh, rows)]
        last = len(sizes) - 1
        macs = sum(r * ww * 2 * (r * dc + 2 * dc + (n > 0) * dc) for n, r in enumerate(sizes))  # down walk
        macs += sum(r * ww * 2 * 3 * dc for r in sizes[:last])  # up walk, all but its first chunk
        macs += sum(r * ww * dc for r in sizes[:last] + sizes[1:]) if last else 0  # updates: the chunk's rows
        macs += 2 * max(last - 1, 0) * ww * dc  # and the state they hold
        total += macs / (h * w)
    return total


def forward_launch_count(h: int, w: int, form: str = 'v2h', rows: int = CHUNK_ROWS) -> int:
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
        launches = 2 * forward_launch_count(h, w, form) if chosen == 'chunked' else 1
        lines.append(f'| {h} x {w} | {chunks} | {dense:,.0f} | {chunked:,.0f} | {chunked / base:.2f} | {chosen} | '
                     f'{launches} |')
    return '\n'.join(lines)
