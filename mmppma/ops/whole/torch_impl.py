"""Whole attention, torch path: five branches, named by :func:`whole_attention_branch`.

``'dense'`` for the paper form (its mask multiplies the probabilities, so it is built densely, as the reference
does); ``'autograd'`` while the score elements fit (plain autograd with the bias broadcast from the O(N^1.5)
segment-sum tables; one N x N probability map per path is kept for the backward); otherwise ``'inference'`` when
autograd is not recording (blocks of query rows, the paths' probabilities summed in place before one product with
v, softmax rows padded for the CPU kernel) and ``'blockwise'`` when it is (blocks of query rows, each block's bias
built from the tables, only q, k, v and the tables saved; the backward recomputes each block's probabilities and
reduces the bias gradient back into the tables). In an export, ``'export'``: per head, one query image row at a
time, the row's bias broadcast from slices of the tables, in a loop the exporter keeps (ONNX ``Scan``), on maps
above the export target's threshold or of a dynamic size (below, ``'autograd'``). Scores and
softmaxes are float32 (float64 for float64 inputs).

What fits is sized by the device (:func:`~mmppma.ops.torch_support.score_elements`): on a GPU a share of its
memory bounds both the one-shot scores and a block; on a CPU ``SMALL_ELEMENTS`` bounds the scores kept for a
backward, ``BLOCK_ELEMENTS`` a block, and inference always runs blocks (they stay in cache).
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch

from ..checks import table_dtype
from ..export import exporting
from ..forms import paths
from ..masks import (
    column_segment_sums,
    manhattan_segment_sums,
    row_segment_sums,
    segment_sum,
    v2h_log_mask,
)
from ..torch_support import (
    export_loops,
    flatten,
    needs_grad,
    padded,
    scan_slices,
    score_elements,
    softmax_,
    softmax_backward_,
)
from . import reference

# on a CPU: elements of one (B, heads, rows*W, N) score block; bounds the transient memory of the blockwise path
BLOCK_ELEMENTS = 1 << 21
# on a CPU: up to this many (B * heads * N * N) score elements, whole attention keeps its probabilities for the
# backward (plain autograd, fastest); above it, the blockwise path recomputes them (memory O(N^1.5))
SMALL_ELEMENTS = 1 << 22


class _BlockTables:
    """The O(N^1.5) segment-sum tables of the V2H mask, laid out so that each block's bias broadcasts with a
    contiguous innermost dim, and the matching gradient accumulators.

    sa: (B|1, heads, H, W, W) row segment sums [i, j, l]; sb: (B|1, heads, W, H, H) column ones [l, i, k].
    Scores of query image rows [r0, r1) are viewed as [i, j, k, l] (query (i, j), key (k, l)); then
    M[i, j, k, l] = Sa[i, j, l] + Sb[l, i, k] ('v2h') and M^T[i, j, k, l] = Sa[k, l, j] + Sb[j, k, i] ('h2v').
    """

    def __init__(self, sa: torch.Tensor, sb: torch.Tensor, names: Sequence[str]):
        self.w, self.h = sa.shape[-1], sb.shape[-1]
        self.paths = tuple(names)
        self.tables = {}
        if 'v2h' in names:  # [i, j, l] and [i, k, l]
            self.tables['v2h'] = (sa, sb.permute(0, 1, 3, 4, 2).contiguous())
        if 'h2v' in names:  # [j, k, l] and [i, j, k]
            self.tables['h2v'] = (sa.permute(0, 1, 4, 2, 3).contiguous(), sb.permute(0, 1, 4, 2, 3).contiguous())
        self.grads = None

    def with_bias(self, s: torch.Tensor, path: str, r0: int, r1: int, out: torch.Tensor) -> torch.Tensor:
        """Scores ``s`` (B, heads, (r1-r0)*W, N) plus the block's log-mask, written to ``out`` (which may be
        ``s``): one pass, no bias-sized temporary."""
        b, heads = s.shape[:2]
        shape6 = (b, heads, r1 - r0, self.w, self.h, self.w)  # [i, j, k, l]
        ta, tb = self.tables[path]
        if path == 'v2h':
            first, second = ta[:, :, r0:r1].unsqueeze(-2), tb[:, :, r0:r1].unsqueeze(3)
        else:
            first, second = ta.unsqueeze(2), tb[:, :, r0:r1].unsqueeze(-1)
        x6 = torch.add(s.view(shape6), first, out=out.view(shape6))
        x6 += second
        return out

    def reduce_grad(self, ds: torch.Tensor, path: str, r0: int, r1: int) -> None:
        """Adjoint of :meth:`with_bias`: add the bias gradient of the block into the tables' gradients."""
        b, heads = ds.shape[:2]
        if self.grads is None:
            self.grads = {p: tuple(ds.new_zeros(b, *t.shape[1:]) for t in self.tables[p]) for p in self.paths}
        ga, gb = self.grads[path]
        ds6 = ds.view(b, heads, r1 - r0, self.w, self.h, self.w)  # [i, j, k, l]
        if path == 'v2h':
            ga[:, :, r0:r1] += ds6.sum(4)  # [i, j, l]
            gb[:, :, r0:r1] += ds6.sum(3)  # [i, k, l]
        else:
            ga += ds6.sum(2)  # [j, k, l]
            gb[:, :, r0:r1] += ds6.sum(5)  # [i, j, k]

    def table_grads(self, shape_a: torch.Size, shape_b: torch.Size, scale: float):
        """``scale`` * the gradients of sa and sb in their own layouts, summed over the batch where the
        tables were broadcast over it."""
        dsa = dsb = None
        for path, (ga, gb) in self.grads.items():
            if path == 'v2h':
                ga, gb = ga, gb.permute(0, 1, 4, 2, 3)
            else:
                ga, gb = ga.permute(0, 1, 3, 4, 2), gb.permute(0, 1, 3, 4, 2)
            dsa = ga if dsa is None else dsa + ga
            dsb = gb if dsb is None else dsb + gb
        if shape_a[0] != dsa.shape[0]:
            dsa = dsa.sum(0, keepdim=True)
        if shape_b[0] != dsb.shape[0]:
            dsb = dsb.sum(0, keepdim=True)
        return (dsa * scale).contiguous(), (dsb * scale).contiguous()


def _rows_per_block(b: int, heads: int, h: int, w: int, device: torch.device) -> int:
    return max(1, min(h, score_elements(device, BLOCK_ELEMENTS) // max(1, b * heads * w * h * w)))


class _BlockBuffers:
    """Block-sized work tensors allocated once per call and reused by every block (fresh multi-MB tensors
    per block cost page faults that are dearer than the arithmetic on them); the last, shorter block
    takes a contiguous leading part of each."""

    def __init__(self, like: torch.Tensor, count: int, numel: int):
        self.flat = [like.new_empty(numel) for _ in range(count)]

    def get(self, *shape: int) -> List[torch.Tensor]:
        numel = math.prod(shape)
        return [f[:numel].view(shape) for f in self.flat]


def _blocks(h: int, w: int, step: int):
    """(r0, r1, rows): query image rows [r0, r1) per block of ``step`` rows and their token slice."""
    for r0 in range(0, h, step):
        r1 = min(h, r0 + step)
        yield r0, r1, slice(r0 * w, r1 * w)


def _masked_softmax_blocks(q, k, v, sa, sb, form: str) -> torch.Tensor:
    """Whole attention of ``form`` ('release' | 'v2h' | 'h2v'): the mean over its paths of
    softmax(q k^T + M_p) v, blockwise over query rows, no autograd: q, k (B, heads, N, d) (q pre-scaled),
    v (B, heads, N, d_v) -> (B, heads, N, d_v).

    Each block's probabilities are summed over the paths before the one product with v. Block tensors live
    in buffers reused across blocks and are updated in place. Score rows are :func:`padded` (keys padded with
    zero rows, their scores set to -inf), for the faster softmax.
    """
    b, heads, n, _ = q.shape
    h, w = sb.shape[-1], sa.shape[-1]
    names = paths(form)
    weight = 1.0 / len(names)  # the paths' probabilities are summed, the weight applied to the (N, d) product
    n_pad = padded(n, q.device)
    out = torch.empty(b, heads, n, v.shape[-1], dtype=q.dtype, device=q.device)
    tables = _BlockTables(sa, sb, names)
    step = _rows_per_block(b, heads, h, w, q.device)
    buffers = _BlockBuffers(q, len(names), b * heads * step * w * n_pad)
    if n_pad != n:
        k = torch.cat([k, k.new_zeros(b, heads, n_pad - n, k.shape[-1])], 2)
    kt = k.transpose(-1, -2)
    for r0, r1, rows in _blocks(h, w, step):
        bufs = buffers.get(b, heads, (r1 - r0) * w, n_pad)
        s = torch.matmul(q[:, :, rows], kt, out=bufs[-1])
        for idx, path in enumerate(names):  # the last path overwrites the scores themselves
            tables.with_bias(s[..., :n], path, r0, r1, out=bufs[idx][..., :n])
            bufs[idx][..., n:] = float('-inf')
            softmax_(bufs[idx])
        for p in bufs[:-1]:
            s.add_(p)
        out[:, :, rows] = s[..., :n] @ v
    if weight != 1.0:
        out.mul_(weight)
    return out


def _add_transposed_product(acc_t: torch.Tensor, x: torch.Tensor, block: torch.Tensor) -> None:
    """``acc_t += x^T @ block`` per (image, head): acc_t (B * heads, d, N), x (B, heads, rows, d) (a slice of
    whole rows), block (B, heads, rows, N)."""
    bh, d, n = acc_t.shape
    acc_t.baddbmm_(x.reshape(bh, -1, d).transpose(1, 2), block.reshape(bh, -1, n))


def _masked_softmax_blocks_backward(dout, q, k, v, sa, sb, form: str, table_grads: bool):
    """Gradients (dq, dk, dv, dsa, dsb) of :func:`_masked_softmax_blocks` for the output gradient ``dout``;
    each block's probabilities are recomputed (one fused softmax per path costs no more than re-reading a
    saved log-sum-exp). dsa, dsb are None unless ``table_grads``."""
    names = paths(form)
    weight = 1.0 / len(names)
    b, heads, n, _ = q.shape
    h, w = sb.shape[-1], sa.shape[-1]
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)  # contiguous, as the fake impl says
    # dk, dv accumulate transposed, (B * heads, d, N): each block adds (its d x rows) @ (rows x N) in place,
    # a product with contiguous operands (the (N x rows) @ (rows x d) form runs on a transposed operand)
    dk_t = k.new_zeros(b * heads, k.shape[-1], n)
    dv_t = v.new_zeros(b * heads, v.shape[-1], n)
    tables = _BlockTables(sa, sb, names)
    step = _rows_per_block(b, heads, h, w, q.device)
    # scores (then the last path's probabilities / score gradient), dprobs, one per further path,
    # and one more with several paths: the first path's score gradient goes there, so that its
    # probabilities stay in place to become the probability sum (no copy)
    multi = len(names) > 1
    buffers = _BlockBuffers(q, 2 + (len(names) - 1) + multi, b * heads * step * w * n)
    kt = k.transpose(-1, -2)
    vt = v.transpose(-1, -2)
    for r0, r1, rows in _blocks(h, w, step):
        s, dprobs, *bufs = buffers.get(b, heads, (r1 - r0) * w, n)
        ds_first = bufs.pop() if multi else None
        outs = bufs + [s]  # the last path works in the score buffer
        qb, db = q[:, :, rows], dout[:, :, rows]
        torch.matmul(qb, kt, out=s)
        torch.matmul(db, vt, out=dprobs)  # d(loss) / d(probabilities), before the weight
        p_sum = None
        for idx, path in enumerate(names):
            p = softmax_(tables.with_bias(s, path, r0, r1, out=outs[idx]))
            if not multi:
                _add_transposed_product(dv_t, db, p)
                ds = softmax_backward_(dprobs, p)  # into p's storage on CPU
            elif idx == 0:
                p_sum = p
                ds = softmax_backward_(dprobs, p, out=ds_first)
            else:
                p_sum.add_(p)
                ds = softmax_backward_(dprobs, p)
            if table_grads:
                tables.reduce_grad(ds, path, r0, r1)
            outs[idx] = ds
        if multi:
            _add_transposed_product(dv_t, db, p_sum)
        ds_sum = outs[-1]
        for ds in outs[:-1]:
            ds_sum = ds_sum.add_(ds)
        dq[:, :, rows] = ds_sum @ k
        _add_transposed_product(dk_t, qb, ds_sum)
    dk = dk_t.view(b, heads, -1, n).transpose(-1, -2).contiguous()
    dv = dv_t.view(b, heads, -1, n).transpose(-1, -2).contiguous()
    if weight != 1.0:
        for t in (dq, dk, dv):
            t.mul_(weight)
    dsa = dsb = None
    if table_grads:
        dsa, dsb = tables.table_grads(sa.shape, sb.shape, weight)
    return dq, dk, dv, dsa, dsb


# The blockwise branch as torch.library ops: its Python loop over row blocks (as many as the shapes ask for)
# and its in-place block buffers are eager code, so torch.compile sees one node per call, with the output
# shapes the fake implementations give, and the backward as a second node.
@torch.library.custom_op('mmppma::whole_attention_blockwise', mutates_args=())
def whole_attention_blockwise(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sa: torch.Tensor,
                              sb: torch.Tensor, form: str) -> torch.Tensor:
    """The ``'blockwise'`` and ``'inference'`` branches of whole attention: ``form`` ('release' | 'v2h' | 'h2v') of
    softmax(q k^T + M) v, q pre-scaled. q, k (B, heads, N, d); v (B, heads, N, d_v); sa (B|1, heads, H, W, W),
    sb (B|1, heads, W, H, H) segment-sum tables, all one float dtype -> (B, heads, N, d_v). Memory O(N^1.5):
    the backward recomputes each block's probabilities."""
    return _masked_softmax_blocks(q, k, v, sa, sb, form).contiguous()  # as the fake impl


@whole_attention_blockwise.register_fake
def _(q, k, v, sa, sb, form):
    return q.new_empty(*q.shape[:-1], v.shape[-1])


@torch.library.custom_op('mmppma::whole_attention_blockwise_backward', mutates_args=())
def whole_attention_blockwise_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                       sa: torch.Tensor, sb: torch.Tensor, form: str,
                                       table_grads: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsa, dsb) of :func:`whole_attention_blockwise`; dsa, dsb (shaped as sa, sb) only with
    ``table_grads``, else empty (0,) tensors."""
    dq, dk, dv, dsa, dsb = _masked_softmax_blocks_backward(dout, q, k, v, sa, sb, form, table_grads)
    if not table_grads:
        dsa, dsb = sa.new_empty(0), sb.new_empty(0)
    # contiguous whatever the inputs' strides, as the fake impl says (compiled code asserts the strides)
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), dsa.contiguous(), dsb.contiguous()


@whole_attention_blockwise_backward.register_fake
def _(dout, q, k, v, sa, sb, form, table_grads):
    tables = (sa.new_empty(sa.shape), sb.new_empty(sb.shape)) if table_grads else (sa.new_empty(0), sb.new_empty(0))
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)) + tables


def _blockwise_setup_context(ctx, inputs, output):
    q, k, v, sa, sb, form = inputs
    ctx.save_for_backward(q, k, v, sa, sb)
    ctx.form = form


def _blockwise_backward(ctx, dout):
    q, k, v, sa, sb = ctx.saved_tensors
    table_grads = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]
    dq, dk, dv, dsa, dsb = whole_attention_blockwise_backward(dout, q, k, v, sa, sb, ctx.form, table_grads)
    if not table_grads:
        dsa = dsb = None
    return dq, dk, dv, dsa, dsb, None


whole_attention_blockwise.register_autograd(_blockwise_backward, setup_context=_blockwise_setup_context)


def _whole_torch_export(q, k, v, sa, sb, form):
    """The ``'export'`` branch: each head on its own, one query image row at a time (two nested
    :func:`~mmppma.ops.torch_support.scan_slices`, ONNX ``Scan``s when exported). A row's (W, N) scores get each
    path's bias as the sum of two slices of the tables, broadcast, so no N x N map or transpose is formed and each
    row's maps stay in cache; the paths' probabilities are summed before the one product with v. q pre-scaled,
    (B, heads, N, d); sa (B, heads, H, W, W), sb (B, heads, W, H, H)."""
    b, heads, n, d = q.shape
    h, w = sb.shape[-1], sa.shape[-1]
    v2h, h2v = (path in paths(form) for path in ('v2h', 'h2v'))
    # per head: queries by image row (H, B, W, d), keys transposed (B, d, N), values (B, N, d_v)
    per_head = [q.reshape(b, heads, h, w, d).permute(1, 2, 0, 3, 4), k.permute(1, 0, 3, 2), v.transpose(0, 1)]
    # the bias of query row i's scores [j, k, l] (query (i, j), key (k, l)) per path, as per-row table slices; a
    # segment sum is symmetric in its two ends (Sa[i, j, l] = Sa[i, l, j]), so these layouts are taken with the
    # tables' last dim kept last where it can be (moving it costs several times more)
    if v2h:  # Sa[i, j, l] (H, B, W, W) broadcast over k, Sb[l, i, k] (H, B, H, W) over j
        per_head += [sa.permute(1, 2, 0, 3, 4), sb.permute(1, 3, 0, 4, 2)]
    if h2v:  # Sb[j, k, i] = Sb[j, i, k] (H, B, W, H) broadcast over l; then Sa[k, l, j] = Sa[k, j, l] (B, W, H, W),
        # the same for every row
        per_head += [sb.permute(1, 3, 0, 2, 4), sa.permute(1, 0, 3, 2, 4)]

    def head(qh, kth, vh, *tables):
        row_tables, sa_h2v = (tables[:-1], tables[-1]) if h2v else (tables, None)

        def row(qi, *t):
            s = qi @ kth  # (B, W, N)
            probs = None
            if v2h:
                x = s.unflatten(-1, t[1].shape[-2:]) + t[0].unsqueeze(-2) + t[1].unsqueeze(-3)
                probs = x.flatten(-2).softmax(-1)
            if h2v:
                p = (s.unflatten(-1, sa_h2v.shape[-2:]) + sa_h2v + t[-1].unsqueeze(-1)).flatten(-2).softmax(-1)
                probs = p if probs is None else probs + p
            return probs @ vh  # (B, W, d_v)

        return scan_slices(row, qh, *row_tables)  # (H, B, W, d_v)

    out = scan_slices(head, *per_head)  # (heads, H, B, W, d_v)
    out = out.permute(2, 0, 1, 3, 4).reshape(b, heads, n, v.shape[-1])
    return out * 0.5 if v2h and h2v else out


def _whole_torch_small(q, k, v, sa, sb, form):
    """Plain autograd with the bias broadcast from the tables: fastest while N x N is small. q pre-scaled."""
    s = q @ k.transpose(-1, -2)
    m = v2h_log_mask(sa, sb)
    out, weight = 0, 1.0 / len(paths(form))
    for path in paths(form):
        # weighting the (N, d) output, not the (N, N) probabilities, keeps one saved N x N per path
        out = out + weight * ((s + (m if path == 'v2h' else m.transpose(-1, -2))).softmax(-1) @ v)
    return out


def whole_attention_branch(batch: int, heads: int, height: int, width: int, form: str = 'release',
                           grad: bool = True, device: Optional[torch.device] = None) -> str:
    """The branch the ``torch`` path of whole attention (:func:`~mmppma.ops.ppma_attention`,
    :func:`~mmppma.ops.manhattan_attention`) takes for q (batch, heads, height, width, d) on ``device`` (None: a
    CPU): ``'dense'`` (form 'paper'); in an export (:func:`mmppma.ops.export.exporting`) ``'export'`` in a
    dynamic one or above the export target's threshold, else ``'autograd'``; otherwise ``'autograd'`` while the
    batch * heads * N^2 score elements fit (on a GPU :func:`~mmppma.ops.torch_support.score_elements`, a share of
    its memory; on a CPU ``SMALL_ELEMENTS`` = 2^22 with ``grad``, none without); otherwise ``'inference'``
    (autograd not recording: ``grad=False``) or ``'blockwise'``. See the module docstring."""
    if form == 'paper':
        return 'dense'
    if exporting():  # plain ops; on large maps (or any, in a dynamic export) in a loop over rows the exporter keeps
        return 'export' if export_loops('whole', height * width) else 'autograd'
    cpu = SMALL_ELEMENTS if grad else -1  # a CPU runs inference in blocks whatever the size
    if batch * heads * (height * width)**2 <= (cpu if device is None else score_elements(device, cpu)):
        return 'autograd'
    return 'blockwise' if grad else 'inference'


def whole_torch(q, k, v, sa, sb, scale, form):
    """The torch path of whole attention of ``form`` from the segment-sum tables sa, sb (see the module docstring)."""
    dtype = table_dtype(q, k, v, sa, sb)
    b, heads, h, w, _ = q.shape
    qf, kf, vf = flatten(q).to(dtype), flatten(k).to(dtype), flatten(v).to(dtype)
    if scale != 1.0:  # the models fold the scale into k
        qf = qf * scale
    sa, sb = sa.to(dtype), sb.to(dtype)
    branch = whole_attention_branch(b, heads, h, w, grad=needs_grad(qf, kf, vf, sa, sb), device=q.device)
    if branch == 'export':
        out = _whole_torch_export(qf, kf, vf, sa.expand(b, -1, -1, -1, -1), sb.expand(b, -1, -1, -1, -1), form)
    elif branch == 'autograd':
        out = _whole_torch_small(qf, kf, vf, sa.expand(b, -1, -1, -1, -1), sb.expand(b, -1, -1, -1, -1),
                                 form)
    else:
        out = whole_attention_blockwise(qf, kf, vf, sa, sb, form)
    return out.reshape(*v.shape).to(v.dtype)


def ppma_attention_plan(q, k, v, la, lb, scale: float, form: str, tables: bool):
    """The torch path of :func:`~mmppma.ops.ppma_attention` (:class:`~mmppma.ops.plan.Op`): the paper form's is the
    dense one (its mask multiplies the probabilities after the softmax: no blockwise log-sum-exp trick applies)."""
    if form == 'paper':
        return reference.ppma_attention_plan(q, k, v, la, lb, scale, form, tables)
    if tables:
        return lambda q, k, v, ca, cb: whole_torch(q, k, v, segment_sum(ca), segment_sum(cb.transpose(-1, -2)), scale,
                                                   form)
    return lambda q, k, v, la, lb: whole_torch(q, k, v, row_segment_sums(la), column_segment_sums(lb), scale, form)


def manhattan_attention_plan(q, k, v, log_decay, scale: float):
    """The torch path of :func:`~mmppma.ops.manhattan_attention`: whole attention's on per-head segment sums."""
    h, w = q.shape[2:4]
    dtype = table_dtype(q, k, v, log_decay)
    return lambda q, k, v, log_decay: whole_torch(q, k, v, *manhattan_segment_sums(log_decay, h, w, dtype), scale,
                                                  'v2h')
