"""Softmax attention with polyline path masks: whole (PPMVA), criss-cross (PPMCCA) and RMT's Manhattan.

Layouts: q, k (B, heads, H, W, d); v (B, heads, H, W, d_v); log-decays la, lb (B, heads, H, W), <= 0.
All scores, biases and softmaxes are float32 (float64 for float64 inputs); outputs take v's dtype.

``reference`` forms the dense N x N mask. The ``torch`` path of whole attention takes one of four branches
(:func:`whole_attention_branch`): ``'dense'`` for the paper form (its mask multiplies the probabilities, so it
is built densely, as the reference does); ``'inference'`` when autograd is not recording (blocks of query
rows, the paths' probabilities summed in place before one product with v, softmax rows padded for the CPU
kernel); ``'autograd'`` up to ``SMALL_ELEMENTS`` score elements (plain autograd with the bias broadcast from
the O(N^1.5) segment-sum tables; one N x N probability map per path is kept for the backward); ``'blockwise'``
above that (blocks of query rows, each block's bias built from the tables, only q, k, v and the tables saved;
the backward recomputes each block's probabilities and reduces the bias gradient back into the tables). The
criss-cross torch path works on (W x W) and (H x H) line maps only; without autograd it runs per group of
(image, head) maps, the group's maps kept in cache; under autograd its form 'release' is one autograd.Function
with a hand backward (eager, without autocast; otherwise plain autograd).
"""
import math
from typing import List, Sequence, Tuple

import torch

from ._checks import check_choice, check_log_decay, check_qkv, table_dtype
from .dispatch import exporting, resolve_impl
from .polyline_mask import (
    column_segment_sums,
    decay_tables,
    line_distance,
    manhattan_decay_mask,
    polyline_mask,
    row_segment_sums,
    v2h_log_mask,
)

WHOLE_FORMS = ('release', 'paper', 'v2h', 'h2v')
CRISS_CROSS_FORMS = ('release', 'v2h', 'h2v')
# criss-cross form -> the order in which row (Aw) and column (Ah) attention compose: 'v2h' is Aw(Ah v)
# (columns first), 'h2v' is Ah(Aw v) (rows first), 'release' the mean of both
_CRISS_CROSS_ORDER = {'release': 'both', 'v2h': 'col_row', 'h2v': 'row_col'}

# elements of one (B, heads, rows*W, N) score block; bounds the transient memory of the blockwise path
BLOCK_ELEMENTS = 1 << 21
# up to this many (B * heads * N * N) score elements, whole attention keeps its probabilities for the
# backward (plain autograd, fastest); above it, the blockwise path recomputes them (memory O(N^1.5))
SMALL_ELEMENTS = 1 << 22
# score elements of one group of (image, head) slices on the no-autograd criss-cross path: a group's row and
# column maps stay in cache from their bias to their last product
SLICE_ELEMENTS = 1 << 18


def _needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd records ops on these tensors; without it the ops take their inference paths (no saved
    tensors, in-place softmax)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _eager_inference(*tensors: torch.Tensor) -> bool:
    """Whether the criss-cross ops take their inference loop over groups of (image, head) maps: autograd not
    recording, and neither torch.compile tracing (a Python loop over the batch would specialise the graph on
    its size) nor an export (:func:`mmppma.ops.dispatch.exporting`)."""
    return not _needs_grad(*tensors) and not torch.compiler.is_compiling() and not exporting()


def _flatten(t: torch.Tensor) -> torch.Tensor:
    b, h, hh, ww, d = t.shape
    return t.reshape(b, h, hh * ww, d)


# --------------------------------------------------------------------------------------------------
# whole attention, torch path
# --------------------------------------------------------------------------------------------------
class _BlockTables:
    """The O(N^1.5) segment-sum tables of the V2H mask, laid out so that each block's bias broadcasts with a
    contiguous innermost dim, and the matching gradient accumulators.

    sa: (B|1, heads, H, W, W) row segment sums [i, j, l]; sb: (B|1, heads, W, H, H) column ones [l, i, k].
    Scores of query image rows [r0, r1) are viewed as [i, j, k, l] (query (i, j), key (k, l)); then
    M[i, j, k, l] = Sa[i, j, l] + Sb[l, i, k] ('v2h') and M^T[i, j, k, l] = Sa[k, l, j] + Sb[j, k, i] ('h2v').
    """

    def __init__(self, sa: torch.Tensor, sb: torch.Tensor, paths: Sequence[str]):
        self.w, self.h = sa.shape[-1], sb.shape[-1]
        self.paths = tuple(paths)
        self.tables = {}
        if 'v2h' in paths:  # [i, j, l] and [i, k, l]
            self.tables['v2h'] = (sa, sb.permute(0, 1, 3, 4, 2).contiguous())
        if 'h2v' in paths:  # [j, k, l] and [i, j, k]
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


def _softmax_(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim into ``x`` (CPU: the kernel overwrites each row in place; elsewhere through
    a temporary)."""
    if x.device.type == 'cpu':
        return torch.ops.aten._softmax.out(x, -1, False, out=x)
    return x.copy_(x.softmax(-1))


def _softmax_backward_(grad: torch.Tensor, probs: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
    """``probs * (grad - rowsum(probs * grad))`` (the softmax backward), into ``out`` if given, else into
    ``probs``'s storage on CPU."""
    if out is not None:
        return torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=out)
    if probs.device.type == 'cpu':
        return torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=probs)
    return torch._softmax_backward_data(grad, probs, -1, probs.dtype)


def _padded(n: int, device: torch.device) -> int:
    """Softmax row length for n scores on the inference paths: CPU softmax kernels run up to several times
    faster on rows a multiple of 16 long (the padding holds -inf, so the probabilities do not change)."""
    return -(-n // 16) * 16 if device.type == 'cpu' else n


def _rows_per_block(b: int, heads: int, h: int, w: int) -> int:
    return max(1, min(h, BLOCK_ELEMENTS // max(1, b * heads * w * h * w)))


def _common_weight(paths: Tuple[Tuple[str, float], ...]) -> float:
    """The paths' weights are all equal in every form (0.5, 0.5 or a single 1.0): block sums are then taken
    unweighted and the weight is applied to the (N, d) products, saving a pass over each block."""
    weights = {weight for _, weight in paths}
    if len(weights) != 1:
        raise ValueError(f'paths must share one weight; got {paths}')
    return weights.pop()


class _BlockBuffers:
    """Block-sized work tensors allocated once per call and reused by every block (fresh multi-MB tensors
    per block cost page faults that are dearer than the arithmetic on them); the last, shorter block
    takes a contiguous leading part of each."""

    def __init__(self, like: torch.Tensor, count: int, numel: int):
        self.flat = [like.new_empty(numel) for _ in range(count)]

    def get(self, *shape: int) -> List[torch.Tensor]:
        numel = math.prod(shape)
        return [f[:numel].view(shape) for f in self.flat]


def _blocks(b: int, heads: int, h: int, w: int):
    """(r0, r1, rows): query image rows [r0, r1) per block and their token slice."""
    step = _rows_per_block(b, heads, h, w)
    for r0 in range(0, h, step):
        r1 = min(h, r0 + step)
        yield r0, r1, slice(r0 * w, r1 * w)


def _masked_softmax_blocks(q, k, v, sa, sb, paths: Tuple[Tuple[str, float], ...]) -> torch.Tensor:
    """c * sum_p softmax(q k^T + M_p) v over paths p in {'v2h', 'h2v'} (one weight c), blockwise over query
    rows, no autograd: q, k (B, heads, N, d) (q pre-scaled), v (B, heads, N, d_v) -> (B, heads, N, d_v).

    Each block's probabilities are summed over the paths before the one product with v. Block tensors live
    in buffers reused across blocks and are updated in place. Score rows are :func:`_padded` (keys padded with
    zero rows, their scores set to -inf), for the faster softmax.
    """
    b, heads, n, _ = q.shape
    h, w = sb.shape[-1], sa.shape[-1]
    weight = _common_weight(paths)
    n_pad = _padded(n, q.device)
    out = torch.empty(b, heads, n, v.shape[-1], dtype=q.dtype, device=q.device)
    tables = _BlockTables(sa, sb, [path for path, _ in paths])
    step = _rows_per_block(b, heads, h, w)
    buffers = _BlockBuffers(q, len(paths), b * heads * step * w * n_pad)
    if n_pad != n:
        k = torch.cat([k, k.new_zeros(b, heads, n_pad - n, k.shape[-1])], 2)
    kt = k.transpose(-1, -2)
    for r0, r1, rows in _blocks(b, heads, h, w):
        bufs = buffers.get(b, heads, (r1 - r0) * w, n_pad)
        s = torch.matmul(q[:, :, rows], kt, out=bufs[-1])
        for idx, (path, _) in enumerate(paths):  # the last path overwrites the scores themselves
            tables.with_bias(s[..., :n], path, r0, r1, out=bufs[idx][..., :n])
            bufs[idx][..., n:] = float('-inf')
            _softmax_(bufs[idx])
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


def _masked_softmax_blocks_backward(dout, q, k, v, sa, sb, paths: Tuple[Tuple[str, float], ...],
                                    table_grads: bool):
    """Gradients (dq, dk, dv, dsa, dsb) of :func:`_masked_softmax_blocks` for the output gradient ``dout``;
    each block's probabilities are recomputed (one fused softmax per path costs no more than re-reading a
    saved log-sum-exp). dsa, dsb are None unless ``table_grads``."""
    weight = _common_weight(paths)
    b, heads, n, _ = q.shape
    h, w = sb.shape[-1], sa.shape[-1]
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)  # contiguous, as the fake impl says
    # dk, dv accumulate transposed, (B * heads, d, N): each block adds (its d x rows) @ (rows x N) in place,
    # a product with contiguous operands (the (N x rows) @ (rows x d) form runs on a transposed operand)
    dk_t = k.new_zeros(b * heads, k.shape[-1], n)
    dv_t = v.new_zeros(b * heads, v.shape[-1], n)
    tables = _BlockTables(sa, sb, [path for path, _ in paths])
    step = _rows_per_block(b, heads, h, w)
    # scores (then the last path's probabilities / score gradient), dprobs, one per further path,
    # and one more with several paths: the first path's score gradient goes there, so that its
    # probabilities stay in place to become the probability sum (no copy)
    multi = len(paths) > 1
    buffers = _BlockBuffers(q, 2 + (len(paths) - 1) + multi, b * heads * step * w * n)
    kt = k.transpose(-1, -2)
    vt = v.transpose(-1, -2)
    for r0, r1, rows in _blocks(b, heads, h, w):
        s, dprobs, *bufs = buffers.get(b, heads, (r1 - r0) * w, n)
        ds_first = bufs.pop() if multi else None
        outs = bufs + [s]  # the last path works in the score buffer
        qb, db = q[:, :, rows], dout[:, :, rows]
        torch.matmul(qb, kt, out=s)
        torch.matmul(db, vt, out=dprobs)  # d(loss) / d(probabilities), before the weight
        p_sum = None
        for idx, (path, _) in enumerate(paths):
            p = _softmax_(tables.with_bias(s, path, r0, r1, out=outs[idx]))
            if not multi:
                _add_transposed_product(dv_t, db, p)
                ds = _softmax_backward_(dprobs, p)  # into p's storage on CPU
            elif idx == 0:
                p_sum = p
                ds = _softmax_backward_(dprobs, p, out=ds_first)
            else:
                p_sum.add_(p)
                ds = _softmax_backward_(dprobs, p)
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
    return _masked_softmax_blocks(q, k, v, sa, sb, _paths_for(form)).contiguous()  # as the fake impl


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
    dq, dk, dv, dsa, dsb = _masked_softmax_blocks_backward(dout, q, k, v, sa, sb, _paths_for(form), table_grads)
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


def _whole_torch_small(q, k, v, sa, sb, paths):
    """Plain autograd with the bias broadcast from the tables: fastest while N x N is small. q pre-scaled."""
    s = q @ k.transpose(-1, -2)
    m = v2h_log_mask(sa, sb)
    out = 0
    for path, weight in paths:
        # weighting the (N, d) output, not the (N, N) probabilities, keeps one saved N x N per path
        out = out + weight * ((s + (m if path == 'v2h' else m.transpose(-1, -2))).softmax(-1) @ v)
    return out


def whole_attention_branch(batch: int, heads: int, height: int, width: int, form: str = 'release',
                           grad: bool = True) -> str:
    """The branch the ``torch`` path of whole attention (:func:`ppma_attention`, :func:`manhattan_attention`)
    takes for q (batch, heads, height, width, d): ``'dense'`` (form 'paper'), ``'inference'`` (autograd not
    recording: ``grad=False``), ``'autograd'`` (at most ``SMALL_ELEMENTS`` = batch * heads * N^2 score
    elements, or any size in an export: :func:`mmppma.ops.dispatch.exporting`) or ``'blockwise'``. See the module
    docstring."""
    if form == 'paper':
        return 'dense'
    if exporting():  # the plain ops, whatever the size
        return 'autograd'
    if not grad:
        return 'inference'
    return 'autograd' if batch * heads * (height * width)**2 <= SMALL_ELEMENTS else 'blockwise'


def _whole_torch(q, k, v, sa, sb, scale, form):
    dtype = table_dtype(q, k, v, sa, sb)
    b, heads, h, w, _ = q.shape
    qf, kf, vf = _flatten(q).to(dtype), _flatten(k).to(dtype), _flatten(v).to(dtype)
    if scale != 1.0:  # the models fold the scale into k
        qf = qf * scale
    sa, sb = sa.to(dtype), sb.to(dtype)
    branch = whole_attention_branch(b, heads, h, w, grad=_needs_grad(qf, kf, vf, sa, sb))
    if branch == 'autograd':
        out = _whole_torch_small(qf, kf, vf, sa.expand(b, -1, -1, -1, -1), sb.expand(b, -1, -1, -1, -1),
                                 _paths_for(form))
    else:
        out = whole_attention_blockwise(qf, kf, vf, sa, sb, form)
    return out.reshape(*v.shape).to(v.dtype)


def _paths_for(form: str) -> Tuple[Tuple[str, float], ...]:
    return {
        'release': (('v2h', 0.5), ('h2v', 0.5)),
        'v2h': (('v2h', 1.0), ),
        'h2v': (('h2v', 1.0), ),
    }[form]


# --------------------------------------------------------------------------------------------------
# whole attention, reference path (dense, obviously correct)
# --------------------------------------------------------------------------------------------------
def _whole_reference(q, k, v, m, scale, form):
    dtype = table_dtype(q, k, v, m)
    qf, kf, vf = _flatten(q).to(dtype), _flatten(k).to(dtype), _flatten(v).to(dtype)
    s = (qf @ kf.transpose(-1, -2)) * scale
    m = m.to(dtype)
    if form == 'paper':
        attn = s.softmax(-1) * (m.exp() + m.transpose(-1, -2).exp())
    else:
        attn = sum(weight * (s + (m if path == 'v2h' else m.transpose(-1, -2))).softmax(-1)
                   for path, weight in _paths_for(form))
    return (attn @ vf).reshape(*v.shape).to(v.dtype)


def ppma_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, *,
                   scale: float = 1.0, form: str = 'release', impl: str = 'auto') -> torch.Tensor:
    """Whole polyline-path-masked softmax attention (PPMVA).

    q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); la, lb: (B, heads, H, W) -> (B, heads, H, W, d_v).
    With S = scale * q k^T and M the V2H log-mask, ``form``:

    * ``'release'``: 0.5 softmax(S + M) v + 0.5 softmax(S + M^T) v (the released checkpoints);
    * ``'paper'``: (softmax(S) * (exp(M) + exp(M^T))) v (paper Eq. 33; no Triton kernel);
    * ``'v2h'`` / ``'h2v'``: softmax(S + M) v / softmax(S + M^T) v (one path, Table 4 ablation).

    ``impl='torch'`` takes the branch :func:`whole_attention_branch` names: ``'dense'`` for the paper form,
    ``'autograd'`` (keeps the N x N probabilities) while B * heads * N^2 <= ``SMALL_ELEMENTS`` (2^22),
    ``'blockwise'`` (recomputes them, memory O(N^1.5)) above.
    """
    check_choice('form', form, WHOLE_FORMS)
    check_qkv(q, k, v, la, lb)
    requested, impl = impl, resolve_impl(impl, 'ppma_attention', (q, k, v))
    if impl == 'triton':
        from .triton import fallback_for, ppma_attention_triton
        return ppma_attention_triton(q, k, v, la, lb, scale=scale, form=form, fallback=fallback_for(
            requested, lambda: ppma_attention(q, k, v, la, lb, scale=scale, form=form, impl='torch')))
    if impl == 'reference' or form == 'paper':
        # the paper form multiplies probabilities by the mask after the softmax: no blockwise
        # log-sum-exp trick applies, so its torch path is the dense one
        return _whole_reference(q, k, v, polyline_mask(la, lb, form='v2h'), scale, form)
    return _whole_torch(q, k, v, row_segment_sums(la), column_segment_sums(lb), scale, form)


def _manhattan_tables(log_decay: torch.Tensor, h: int, w: int, dtype: torch.dtype):
    """(Sa, Sb) segment-sum tables of RMT's Manhattan mask; log_decay (heads,) or (B, heads), checked."""
    if log_decay.dim() == 1:
        log_decay = log_decay.unsqueeze(0)
    g = log_decay.to(dtype)[:, :, None, None, None]
    sa = g * line_distance(w, log_decay.device, dtype)[None, None, None]  # (B|1, heads, 1, W, W)
    sb = g * line_distance(h, log_decay.device, dtype)[None, None, None]  # (B|1, heads, 1, H, H)
    return sa.expand(-1, -1, h, -1, -1), sb.expand(-1, -1, w, -1, -1)


def manhattan_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, *,
                        scale: float = 1.0, impl: str = 'auto') -> torch.Tensor:
    """RMT's whole attention: softmax(scale * q k^T + log_decay * (|i-k| + |j-l|)) v.

    q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); log_decay: (heads,) or (B, heads), <= 0.
    The Manhattan mask is the polyline mask with constant decays, so this shares the masked kernel (and
    the torch branches of :func:`ppma_attention`'s one-path forms).
    """
    check_qkv(q, k, v)
    check_log_decay(log_decay, q)
    b, heads, h, w, _ = q.shape
    requested, impl = impl, resolve_impl(impl, 'manhattan_attention', (q, k, v))
    dtype = table_dtype(q, k, v, log_decay)
    if impl == 'triton':
        from .triton import fallback_for, manhattan_attention_triton
        return manhattan_attention_triton(q, k, v, log_decay, scale=scale, fallback=fallback_for(
            requested, lambda: manhattan_attention(q, k, v, log_decay, scale=scale, impl='torch')))
    if impl == 'reference':
        m = manhattan_decay_mask(log_decay.to(dtype), h, w)
        m = m if m.dim() == 4 else m.unsqueeze(0)
        return _whole_reference(q, k, v, m.expand(b, -1, -1, -1), scale, 'v2h')
    sa, sb = _manhattan_tables(log_decay, h, w, dtype)
    return _whole_torch(q, k, v, sa, sb, scale, 'v2h')


# --------------------------------------------------------------------------------------------------
# criss-cross attention
# --------------------------------------------------------------------------------------------------
class _SegmentMaskedSoftmax(torch.autograd.Function):
    """``softmax(scores + seg(c))`` along the last dim, with ``seg(c)[t, s] = c[max] - c[min]``.

    scores: (..., L, L) (consumed, on CPU overwritten: a fresh matmul output); c: (..., L), a cumsum along the
    line. The bias is added in place from the O(L) table and only the probabilities are saved; the backward
    reduces the bias gradient straight into ``c`` (``+sign * ds`` at the later index, ``-`` at the earlier one).
    """

    @staticmethod
    def forward(ctx, scores, c):
        if scores.device.type == 'cpu' and not torch.compiler.is_compiling():
            # eager CPU: all in place, the probabilities take the scores' storage (compiled code plans its
            # own buffers, and dynamo traces an autograd.Function only if it marks no input dirty)
            probs = _segment_softmax_(scores, c)
            ctx.mark_dirty(scores)
        else:
            probs = _segment_softmax(scores, c)
        ctx.save_for_backward(probs, c)
        return probs

    @staticmethod
    def backward(ctx, grad):
        probs, c = ctx.saved_tensors
        ds = torch._softmax_backward_data(grad, probs, -1, probs.dtype)  # probs may be needed again
        return ds, _segment_table_grad(ds, c) if ctx.needs_input_grad[1] else None


def _segment_table_grad(ds: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The gradient of the table ``c`` of ``seg(c)`` from the score gradient ``ds`` (left as it was): the sign
    multiplied in place and back (exact), since a second ds-sized tensor costs more (page faults of a fresh
    allocation) than the two passes over ds."""
    sign = _sign_table(c.shape[-1], c.dtype, c.device)
    signed = ds.mul_(sign)
    dc = signed.sum(-1) - signed.sum(-2)
    signed.mul_(sign)
    return dc


def _sign_table(n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """+1 on and below the diagonal, -1 above: (n, n)."""
    return torch.ones(n, n, dtype=dtype, device=device).tril().mul_(2).sub_(1)


def _criss_cross_core(q, k, v, row_probs, col_probs, scale, order):
    """Compose row and column attention. ``row_probs(scores)`` maps (B, heads, H, W, W) scores to
    probabilities, ``col_probs`` likewise for (B, heads, W, H, H) column scores."""
    if scale != 1.0:  # the models fold the scale into k
        q = q * scale
    rows = row_probs(q @ k.transpose(-1, -2))  # (B, heads, H, W, W)
    # k as (B, heads, W, d, H) in one permute: inductor's SDPA pattern for T5-style attention matches a
    # transposed query against a twice-permuted key whatever their rank, and its rewrite fails on 5-D tensors
    cols = col_probs(q.transpose(2, 3) @ k.permute(0, 1, 3, 4, 2))  # (B, heads, W, H, H)

    def along_rows(x):
        return rows @ x

    def along_cols(x):
        return (cols @ x.transpose(2, 3)).transpose(2, 3)

    return compose_criss_cross(along_rows, along_cols, v, order)


class _SegmentCrissCrossBoth(torch.autograd.Function):
    """Criss-cross form ``'release'`` under autograd (torch path): the scores, the in-place segment bias and
    softmax of :class:`_SegmentMaskedSoftmax` for the row maps (table ``ca`` (B, heads, H, W)) and the column
    maps (``cbt`` (B, heads, W, H)), and :func:`compose_criss_cross`'s ops for order ``'both'``, with one hand
    backward. q (pre-scaled), k (B, heads, H, W, d); v (B, heads, H, W, d_v).

    It saves what autograd saves for the same ops (q, k, the tables, both maps' probabilities, [v, Aw v] and
    the column pass [Ah v, Ah Aw v]); its backward forms the row maps' gradient in one product,
    [g, da] @ [Ah v, v]^T (autograd adds two map-sized products: the row maps serve two products), and turns
    each map's gradient into the score gradient in that tensor's own storage.
    """

    @staticmethod
    def forward(ctx, q, k, v, ca, cbt):
        dv = v.shape[-1]
        rows = _segment_softmax_(q @ k.transpose(-1, -2), ca)  # (B, heads, H, W, W)
        cols = _segment_softmax_(q.transpose(2, 3) @ k.permute(0, 1, 3, 4, 2), cbt)  # (B, heads, W, H, H)
        x = torch.cat([v, rows @ v], -1)  # [v, Aw v], (B, heads, H, W, 2 d_v)
        y = cols @ x.transpose(2, 3)  # [Ah v, Ah Aw v] along columns, (B, heads, W, H, 2 d_v)
        both = y.transpose(2, 3)
        ctx.save_for_backward(q, k, ca, cbt, rows, cols, x, y)
        return (rows @ both[..., :dv] + both[..., dv:]).mul_(0.5)

    @staticmethod
    def backward(ctx, grad):
        q, k, ca, cbt, rows, cols, x, y = ctx.saved_tensors
        dv = x.shape[-1] // 2
        g = grad * 0.5
        rows_t = rows.transpose(-1, -2)
        dy = torch.cat([rows_t @ g, g], -1).transpose(2, 3)  # gradient of y, (B, heads, W, H, 2 d_v)
        dcols = dy @ x.permute(0, 1, 3, 4, 2)
        dx = (cols.transpose(-1, -2) @ dy).transpose(2, 3)  # gradient of x, (B, heads, H, W, 2 d_v)
        da = dx[..., dv:]
        drows = torch.cat([g, da], -1) @ torch.cat([y.transpose(2, 3)[..., :dv], x[..., :dv]], -1).transpose(-1, -2)
        dvv = dx[..., :dv] + rows_t @ da if ctx.needs_input_grad[2] else None
        ds_rows, dca = _segment_softmax_backward_(drows, rows, ca, ctx.needs_input_grad[3])
        ds_cols, dcbt = _segment_softmax_backward_(dcols, cols, cbt, ctx.needs_input_grad[4])
        dq = dk = None
        if ctx.needs_input_grad[0]:
            dq = ds_rows @ k + (ds_cols @ k.transpose(2, 3)).transpose(2, 3)
        if ctx.needs_input_grad[1]:
            dk = ds_rows.transpose(-1, -2) @ q + (ds_cols.transpose(-1, -2) @ q.transpose(2, 3)).transpose(2, 3)
        return dq, dk, dvv, dca, dcbt


def _segment_softmax(scores: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``softmax(scores + seg(c))`` of :class:`_SegmentMaskedSoftmax` in plain, out-of-place ops."""
    sign = _sign_table(c.shape[-1], c.dtype, c.device)
    return torch.addcmul(scores, c.unsqueeze(-1), sign).addcmul_(c.unsqueeze(-2), sign, value=-1.0).softmax(-1)


def _segment_softmax_(scores: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The forward of :class:`_SegmentMaskedSoftmax` in the storage of ``scores`` (no autograd)."""
    sign = _sign_table(c.shape[-1], c.dtype, c.device)
    return _softmax_(scores.addcmul_(c.unsqueeze(-1), sign).addcmul_(c.unsqueeze(-2), sign, value=-1.0))


def _segment_softmax_backward_(grad: torch.Tensor, probs: torch.Tensor, c: torch.Tensor, table_grad: bool):
    """(score gradient, table gradient or None) of :class:`_SegmentMaskedSoftmax`; the score gradient takes
    ``grad``'s storage (a tensor of the caller's own)."""
    ds = torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=grad)
    return ds, _segment_table_grad(ds, c) if table_grad else None


def compose_criss_cross(along_rows, along_cols, v: torch.Tensor, order: str) -> torch.Tensor:
    """Criss-cross attention of ``v`` (.., H, W, dv) from row attention ``along_rows`` and column attention
    ``along_cols`` (each maps (.., H, W, c) to (.., H, W, c)) in ``order``; shared by the torch and Triton
    paths."""
    if order == 'row_col':
        return along_cols(along_rows(v))
    if order == 'col_row':
        return along_rows(along_cols(v))
    # one column pass serves both orders, Ah [v, Aw v] = [Ah v, Ah Aw v]: with narrow heads the products
    # are bound by reading the attention maps, so each map is read once per pass, not twice
    # 0.5 a + 0.5 b == 0.5 (a + b) exactly (scaling by a power of two)
    dv = v.shape[-1]
    both = along_cols(torch.cat([v, along_rows(v)], -1))
    return (along_rows(both[..., :dv]) + both[..., dv:]).mul_(0.5)


def _slices(b: int, heads: int, per_map: int):
    """(i0, i1, n0, n1): images [i0, i1) and heads [n0, n1) per group of (image, head) maps, each group about
    ``SLICE_ELEMENTS`` elements for ``per_map`` elements per map: whole images while one image's heads fit, else
    groups of heads of one image."""
    group = max(1, SLICE_ELEMENTS // per_map)
    if group >= heads:
        images = group // heads
        for i0 in range(0, b, images):
            yield i0, min(b, i0 + images), 0, heads
    else:
        for i in range(b):
            for n0 in range(0, heads, group):
                yield i, i + 1, n0, min(heads, n0 + group)


def _criss_cross_slices(q, k, v, row_bias, col_bias, scale, order):
    """:func:`_criss_cross_core` without autograd, for a group of (image, head) maps at a time (:func:`_slices`),
    so that the group's maps stay in cache from the bias to the last product, while the ops on small maps still
    span several images.

    The maps' rows are :func:`_padded` (keys padded with zero rows): ``row_bias(s, i0, i1, n0, n1)`` adds the
    bias of images [i0, i1), heads [n0, n1) to row scores s (I, G, H, W, W_pad) in place, -inf in the padding,
    and ``col_bias`` likewise to column scores (I, G, W, H, H_pad). Returns (B, heads, H, W, d_v), a view of a
    (B, H, W, heads, d_v) tensor (the layers' token layout).
    """
    if scale != 1.0:
        q = q * scale
    b, heads, h, w, d = q.shape
    dv = v.shape[-1]
    out = torch.empty(b, h, w, heads, dv, dtype=v.dtype, device=v.device).permute(0, 3, 1, 2, 4)
    slices = list(_slices(b, heads, h * w * max(h, w)))
    images, group = max(i1 - i0 for i0, i1, _, _ in slices), max(n1 - n0 for _, _, n0, n1 in slices)
    # the group's keys along rows (I, G, H, W_pad, d) and along columns (I, G, W, H_pad, d); padding rows stay 0
    k_rows = k.new_zeros(images, group, h, _padded(w, k.device), d)
    k_cols = k.new_zeros(images, group, w, _padded(h, k.device), d)
    for i0, i1, n0, n1 in slices:
        qg, vg = q[i0:i1, n0:n1], v[i0:i1, n0:n1]  # (I, G, H, W, d)
        kr, kc = k_rows[:i1 - i0, :n1 - n0], k_cols[:i1 - i0, :n1 - n0]
        kr[..., :w, :] = k[i0:i1, n0:n1]
        kc[..., :h, :] = k[i0:i1, n0:n1].transpose(2, 3)
        rows = _softmax_(row_bias(qg @ kr.transpose(-1, -2), i0, i1, n0, n1))[..., :w]  # (I, G, H, W, W)
        cols = _softmax_(col_bias(qg.transpose(2, 3) @ kc.transpose(-1, -2), i0, i1, n0, n1))[..., :h]
        out[i0:i1, n0:n1] = compose_criss_cross(lambda x: rows @ x,
                                                lambda x: (cols @ x.transpose(2, 3)).transpose(2, 3), vg, order)
    return out


def _pad_last(t: torch.Tensor, length: int, value: float) -> torch.Tensor:
    """``t`` with its last dim extended to ``length`` by ``value``."""
    if t.shape[-1] == length:
        return t
    return torch.cat([t, t.new_full((*t.shape[:-1], length - t.shape[-1]), value)], -1)


def _criss_cross_reference(q, k, v, la, lb, scale, order):
    """Dense: criss-cross as N x N matrices (row attention A_w and column attention A_h embedded in
    block-sparse N x N form), composed by matrix products."""
    dtype = table_dtype(q, k, v, la, lb)
    b, heads, h, w, _ = q.shape
    n = h * w
    qf, kf, vf = _flatten(q).to(dtype), _flatten(k).to(dtype), _flatten(v).to(dtype)
    s = (qf @ kf.transpose(-1, -2)) * scale
    ii = torch.arange(n, device=q.device) // w
    jj = torch.arange(n, device=q.device) % w
    same_row = ii[:, None] == ii[None, :]
    same_col = jj[:, None] == jj[None, :]
    # The 2D V2H mask restricted to one row is the row segment sum, to one column the column one.
    m = polyline_mask(la.to(dtype), lb.to(dtype), form='v2h')
    neg_inf = torch.full((), float('-inf'), dtype=dtype, device=q.device)
    a_rows = torch.where(same_row, s + m, neg_inf).softmax(-1)
    a_cols = torch.where(same_col, s + m, neg_inf).softmax(-1)
    row_col = a_cols @ (a_rows @ vf)
    col_row = a_rows @ (a_cols @ vf)
    out = {'row_col': row_col, 'col_row': col_row, 'both': 0.5 * row_col + 0.5 * col_row}[order]
    return out.reshape(*v.shape)


def criss_cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: torch.Tensor,
                          lb: torch.Tensor, *, scale: float = 1.0, form: str = 'release',
                          impl: str = 'auto') -> torch.Tensor:
    """Decomposed criss-cross masked attention (PPMCCA).

    Row attention ``Aw = softmax(scale * q_row k_row^T + Sa)`` (W x W per row), column attention
    ``Ah = softmax(scale * q_col k_col^T + Sb)`` (H x H per column), with the 1D segment-sum biases.
    form ``'release'``: 0.5 Ah(Aw v) + 0.5 Aw(Ah v); ``'v2h'``: Aw(Ah v) (columns first: a key reaches the
    query down its column, then along the query's row, the V2H path); ``'h2v'``: Ah(Aw v) (rows first, RMT).
    Shapes as :func:`ppma_attention`. Never forms an N x N tensor (torch path).
    """
    check_choice('form', form, CRISS_CROSS_FORMS)
    check_qkv(q, k, v, la, lb)
    order = _CRISS_CROSS_ORDER[form]
    requested, impl = impl, resolve_impl(impl, 'criss_cross_attention', (q, k, v))
    if impl == 'triton':
        from .triton import criss_cross_attention_triton, fallback_for
        return criss_cross_attention_triton(q, k, v, la, lb, scale=scale, order=order, fallback=fallback_for(
            requested, lambda: criss_cross_attention(q, k, v, la, lb, scale=scale, form=form, impl='torch')))
    if impl == 'reference':
        return _criss_cross_reference(q, k, v, la, lb, scale, order).to(v.dtype)
    dtype = table_dtype(q, k, v, la, lb)
    ca, cb = decay_tables(la, lb)
    if _eager_inference(q, k, v, la, lb):
        def segment_bias(c):
            """s[..., t, u] += sign[t, u] * (c[t] - c[u]) as _SegmentMaskedSoftmax, for padded rows of s: there
            sign is +1 and c[u] is +inf, so the padding gets -inf."""
            length = c.shape[-1]
            padded = _padded(length, c.device)
            sign = _pad_last(_sign_table(length, dtype, c.device), padded, 1.0)
            c_keys = _pad_last(c, padded, float('inf'))

            def add(s, i0, i1, n0, n1):
                s.addcmul_(c[i0:i1, n0:n1].unsqueeze(-1), sign)
                return s.addcmul_(c_keys[i0:i1, n0:n1].unsqueeze(-2), sign, value=-1.0)
            return add

        return _criss_cross_slices(q.to(dtype), k.to(dtype), v.to(dtype), segment_bias(ca),
                                   segment_bias(cb.transpose(-1, -2)), scale, order).to(v.dtype)
    if exporting():
        return _criss_cross_core(q.to(dtype), k.to(dtype), v.to(dtype), lambda s: _segment_softmax(s, ca),
                                 lambda s: _segment_softmax(s, cb.transpose(-1, -2)), scale, order).to(v.dtype)
    if order == 'both' and not torch.compiler.is_compiling() and not torch.is_autocast_enabled(q.device.type):
        # eager, no autocast (under autocast the products' dtypes differ): one autograd.Function
        qs = q.to(dtype) * scale if scale != 1.0 else q.to(dtype)
        return _SegmentCrissCrossBoth.apply(qs, k.to(dtype), v.to(dtype), ca, cb.transpose(-1, -2)).to(v.dtype)
    return _criss_cross_core(q.to(dtype), k.to(dtype), v.to(dtype),
                             lambda s: _SegmentMaskedSoftmax.apply(s, ca),
                             lambda s: _SegmentMaskedSoftmax.apply(s, cb.transpose(-1, -2)), scale,
                             order).to(v.dtype)


def rmt_criss_cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, *,
                              scale: float = 1.0, impl: str = 'auto') -> torch.Tensor:
    """RMT's decomposed attention: rows first, then columns (form ``'h2v'`` of :func:`criss_cross_attention`),
    fixed decay ``log_decay * |d|`` per axis.

    log_decay: (heads,) or (B, heads). The bias is built once per head, (heads, W, W) and (heads, H, H).
    """
    check_qkv(q, k, v)
    check_log_decay(log_decay, q)
    b, heads, h, w, _ = q.shape
    dtype = table_dtype(q, k, v, log_decay)
    requested, impl = impl, resolve_impl(impl, 'rmt_criss_cross_attention', (q, k, v))
    if impl == 'triton':
        from .triton import fallback_for, rmt_criss_cross_attention_triton
        return rmt_criss_cross_attention_triton(q, k, v, log_decay, scale=scale, fallback=fallback_for(
            requested, lambda: rmt_criss_cross_attention(q, k, v, log_decay, scale=scale, impl='torch')))
    if impl == 'reference':
        g = log_decay.to(dtype)
        g = (g if g.dim() == 2 else g.unsqueeze(0))[:, :, None, None].expand(b, heads, h, w)
        return criss_cross_attention(q, k, v, g, g, scale=scale, form='h2v', impl='reference')
    sa, sb = _manhattan_tables(log_decay, h, w, dtype)
    sa, sb = sa[:, :, :1], sb[:, :, :1]  # one (W, W) and one (H, H) bias per head, broadcast
    if _eager_inference(q, k, v, log_decay):
        def head_bias(table):  # (B|1, heads, 1, L, L) -> -inf in the padding of the rows
            table = _pad_last(table, _padded(table.shape[-1], table.device), float('-inf')).expand(b, -1, -1, -1, -1)
            return lambda s, i0, i1, n0, n1: s.add_(table[i0:i1, n0:n1])
        return _criss_cross_slices(q.to(dtype), k.to(dtype), v.to(dtype), head_bias(sa), head_bias(sb), scale,
                                   'row_col').to(v.dtype)
    return _criss_cross_core(q.to(dtype), k.to(dtype), v.to(dtype), lambda s: s.add_(sa).softmax(-1),
                             lambda s: s.add_(sb).softmax(-1), scale, 'row_col').to(v.dtype)
