"""Softmax attention with polyline path masks: whole (PPMVA), criss-cross (PPMCCA) and RMT's Manhattan.

Layouts: q, k (B, heads, H, W, d); v (B, heads, H, W, d_v); log-decays la, lb (B, heads, H, W), <= 0.
All scores, biases and softmaxes are float32 (float64 for float64 inputs); outputs take v's dtype.

The ``torch`` path of whole attention never keeps an N x N tensor alive across the forward: it walks
over blocks of query rows, builds each block's bias from the O(N^1.5) segment-sum tables, and saves only
the log-sum-exp of each softmax; the backward recomputes the block and reduces the bias gradient back into
the tables (flash-attention style, in plain PyTorch). ``reference`` forms the dense mask.
"""
import math
from typing import List, Sequence, Tuple

import torch

from ._checks import check_choice, check_qkv, table_dtype
from .dispatch import resolve_impl
from .polyline_mask import (column_segment_sums, decay_tables, line_distance, manhattan_decay_mask,
                            polyline_mask, row_segment_sums, v2h_log_mask)

WHOLE_FORMS = ('release', 'paper', 'v2h', 'h2v')
CRISS_CROSS_ORDERS = ('both', 'row_col', 'col_row')
# ops with a Triton kernel in mmppma.ops.triton ('auto' picks it for CUDA tensors)
TRITON_OPS: Tuple[str, ...] = ('ppma_attention', 'manhattan_attention', 'criss_cross_attention',
                               'rmt_criss_cross_attention')

# elements of one (B, heads, rows*W, N) score block; bounds the transient memory of the blockwise path
BLOCK_ELEMENTS = 1 << 21
# up to this many (B * heads * N * N) score elements, whole attention keeps its probabilities for the
# backward (plain autograd, fastest); above it, the blockwise path recomputes them (memory O(N^1.5))
SMALL_ELEMENTS = 1 << 22


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
    """Softmax over the last dim, in place where the kernel allows it (CPU: row by row, same index)."""
    if x.device.type == 'cpu':
        return torch.ops.aten._softmax.out(x, -1, False, out=x)
    return x.softmax(-1)


def _softmax_backward_(grad: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``probs * (grad - rowsum(probs * grad))`` (the softmax backward), into ``probs``'s storage on CPU."""
    if probs.device.type == 'cpu':
        return torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=probs)
    return torch._softmax_backward_data(grad, probs, -1, probs.dtype)


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
    in buffers reused across blocks and are updated in place.
    """
    b, heads, n, _ = q.shape
    h, w = sb.shape[-1], sa.shape[-1]
    weight = _common_weight(paths)
    out = torch.empty(b, heads, n, v.shape[-1], dtype=q.dtype, device=q.device)
    tables = _BlockTables(sa, sb, [path for path, _ in paths])
    step = _rows_per_block(b, heads, h, w)
    buffers = _BlockBuffers(q, len(paths), b * heads * step * w * n)
    kt = k.transpose(-1, -2)
    for r0, r1, rows in _blocks(b, heads, h, w):
        bufs = buffers.get(b, heads, (r1 - r0) * w, n)
        s = torch.matmul(q[:, :, rows], kt, out=bufs[-1])
        for idx, (path, _) in enumerate(paths):  # the last path overwrites the scores themselves
            _softmax_(tables.with_bias(s, path, r0, r1, out=bufs[idx]))
        for p in bufs[:-1]:
            s.add_(p)
        out[:, :, rows] = s @ v
    if weight != 1.0:
        out.mul_(weight)
    return out


def _masked_softmax_blocks_backward(dout, q, k, v, sa, sb, paths: Tuple[Tuple[str, float], ...],
                                    table_grads: bool):
    """Gradients (dq, dk, dv, dsa, dsb) of :func:`_masked_softmax_blocks` for the output gradient ``dout``;
    each block's probabilities are recomputed (one fused softmax per path costs no more than re-reading a
    saved log-sum-exp). dsa, dsb are None unless ``table_grads``."""
    weight = _common_weight(paths)
    b, heads, n, _ = q.shape
    h, w = sb.shape[-1], sa.shape[-1]
    dq = torch.empty_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    tables = _BlockTables(sa, sb, [path for path, _ in paths])
    step = _rows_per_block(b, heads, h, w)
    # scores (then the last path's probabilities / score gradient), dprobs, one per further path,
    # and the probability sum when there are several paths
    multi = len(paths) > 1
    buffers = _BlockBuffers(q, 2 + (len(paths) - 1) + multi, b * heads * step * w * n)
    kt = k.transpose(-1, -2)
    vt = v.transpose(-1, -2)
    for r0, r1, rows in _blocks(b, heads, h, w):
        s, dprobs, *bufs = buffers.get(b, heads, (r1 - r0) * w, n)
        p_sum = bufs.pop() if multi else None
        outs = bufs + [s]  # the last path works in the score buffer
        qb, db = q[:, :, rows], dout[:, :, rows]
        torch.matmul(qb, kt, out=s)
        torch.matmul(db, vt, out=dprobs)  # d(loss) / d(probabilities), before the weight
        for idx, (path, _) in enumerate(paths):
            p = _softmax_(tables.with_bias(s, path, r0, r1, out=outs[idx]))
            if multi:
                p_sum.copy_(p) if idx == 0 else p_sum.add_(p)
            else:
                dv += p.transpose(-1, -2) @ db
            ds = _softmax_backward_(dprobs, p)  # into p's storage on CPU
            if table_grads:
                tables.reduce_grad(ds, path, r0, r1)
            outs[idx] = ds
        if multi:
            dv += p_sum.transpose(-1, -2) @ db
        ds_sum = outs[-1]
        for ds in outs[:-1]:
            ds_sum = ds_sum.add_(ds)
        dq[:, :, rows] = ds_sum @ k
        dk += ds_sum.transpose(-1, -2) @ qb
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
    """The ``'blockwise'`` branch of whole attention: ``form`` ('release' | 'v2h' | 'h2v') of
    softmax(q k^T + M) v, q pre-scaled. q, k (B, heads, N, d); v (B, heads, N, d_v); sa (B|1, heads, H, W, W),
    sb (B|1, heads, W, H, H) segment-sum tables, all one float dtype -> (B, heads, N, d_v). Memory O(N^1.5):
    the backward recomputes each block's probabilities."""
    return _masked_softmax_blocks(q, k, v, sa, sb, _paths_for(form))


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
    return dq, dk, dv, dsa, dsb


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


def _whole_torch(q, k, v, sa, sb, scale, form):
    dtype = table_dtype(q, k, v, sa, sb)
    b, heads, h, w, _ = q.shape
    qf, kf, vf = _flatten(q).to(dtype), _flatten(k).to(dtype), _flatten(v).to(dtype)
    if scale != 1.0:  # the models fold the scale into k
        qf = qf * scale
    sa, sb = sa.to(dtype), sb.to(dtype)
    if b * heads * (h * w)**2 <= SMALL_ELEMENTS:
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


def ppma_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: torch.Tensor, lb: torch.Tensor,
                   scale: float = 1.0, form: str = 'release', impl: str = 'auto') -> torch.Tensor:
    """Whole polyline-path-masked softmax attention (PPMVA).

    q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); la, lb: (B, heads, H, W) -> (B, heads, H, W, d_v).
    With S = scale * q k^T and M the V2H log-mask:

    * ``'release'``: 0.5 softmax(S + M) v + 0.5 softmax(S + M^T) v (the released checkpoints);
    * ``'paper'``: (softmax(S) * (exp(M) + exp(M^T))) v (paper Eq. 33);
    * ``'v2h'`` / ``'h2v'``: softmax(S + M) v / softmax(S + M^T) v (one path, Table 4 ablation).
    """
    check_choice('form', form, WHOLE_FORMS)
    check_qkv(q, k, v, la, lb)
    impl = resolve_impl(impl, 'ppma_attention', (q, k, v), TRITON_OPS)
    if impl == 'triton':
        from .triton import ppma_attention_triton
        return ppma_attention_triton(q, k, v, la, lb, scale=scale, form=form)
    if impl == 'reference' or form == 'paper':
        # the paper form multiplies probabilities by the mask after the softmax: no blockwise
        # log-sum-exp trick applies, so its torch path is the dense one
        return _whole_reference(q, k, v, polyline_mask(la, lb, 'v2h'), scale, form)
    return _whole_torch(q, k, v, row_segment_sums(la), column_segment_sums(lb), scale, form)


def _manhattan_tables(log_decay: torch.Tensor, h: int, w: int, heads: int, dtype: torch.dtype):
    if log_decay.dim() == 1:
        log_decay = log_decay.unsqueeze(0)
    if log_decay.dim() != 2 or log_decay.shape[-1] != heads:
        raise ValueError(f'log_decay: expected (heads,) or (B, heads) with heads={heads}; '
                         f'got {tuple(log_decay.shape)}')
    g = log_decay.to(dtype)[:, :, None, None, None]
    sa = g * line_distance(w, log_decay.device, dtype)[None, None, None]  # (B|1, heads, 1, W, W)
    sb = g * line_distance(h, log_decay.device, dtype)[None, None, None]  # (B|1, heads, 1, H, H)
    return sa.expand(-1, -1, h, -1, -1), sb.expand(-1, -1, w, -1, -1)


def manhattan_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                        scale: float = 1.0, impl: str = 'auto') -> torch.Tensor:
    """RMT's whole attention: softmax(scale * q k^T + log_decay * (|i-k| + |j-l|)) v.

    q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); log_decay: (heads,) or (B, heads), <= 0.
    The Manhattan mask is the polyline mask with constant decays, so this shares the masked kernel.
    """
    check_qkv(q, k, v)
    b, heads, h, w, _ = q.shape
    impl = resolve_impl(impl, 'manhattan_attention', (q, k, v), TRITON_OPS)
    dtype = table_dtype(q, k, v, log_decay)
    if impl == 'triton':
        from .triton import manhattan_attention_triton
        return manhattan_attention_triton(q, k, v, log_decay, scale=scale)
    if impl == 'reference':
        m = manhattan_decay_mask(log_decay.to(dtype), h, w)
        m = m if m.dim() == 4 else m.unsqueeze(0)
        return _whole_reference(q, k, v, m.expand(b, -1, -1, -1), scale, 'v2h')
    sa, sb = _manhattan_tables(log_decay, h, w, heads, dtype)
    return _whole_torch(q, k, v, sa, sb, scale, 'v2h')


# --------------------------------------------------------------------------------------------------
# criss-cross attention
# --------------------------------------------------------------------------------------------------
class _SegmentMaskedSoftmax(torch.autograd.Function):
    """``softmax(scores + seg(c))`` along the last dim, with ``seg(c)[t, s] = c[max] - c[min]``.

    scores: (..., L, L) (consumed, on CPU overwritten: a fresh matmul output); c: (..., L), a cumsum along the line. The bias
    is added in place from the O(L) table and only the probabilities are saved; the backward reduces the
    bias gradient straight into ``c`` (``+sign * ds`` at the later index, ``-`` at the earlier one).
    """

    @staticmethod
    def forward(ctx, scores, c):
        sign = _sign_table(c.shape[-1], c.dtype, c.device)
        if scores.device.type == 'cpu' and not torch.compiler.is_compiling():
            # eager CPU: all in place, the probabilities take the scores' storage (compiled code plans its
            # own buffers, and dynamo traces an autograd.Function only if it marks no input dirty)
            probs = _softmax_(scores.addcmul_(c.unsqueeze(-1), sign).addcmul_(c.unsqueeze(-2), sign, value=-1.0))
            ctx.mark_dirty(scores)
        else:
            probs = torch.addcmul(scores, c.unsqueeze(-1), sign).addcmul_(c.unsqueeze(-2), sign, value=-1.0)
            probs = probs.softmax(-1)
        ctx.save_for_backward(probs, c)
        return probs

    @staticmethod
    def backward(ctx, grad):
        probs, c = ctx.saved_tensors
        ds = torch._softmax_backward_data(grad, probs, -1, probs.dtype)  # probs may be needed again
        dc = None
        if ctx.needs_input_grad[1]:
            signed = ds * _sign_table(c.shape[-1], c.dtype, c.device)
            dc = signed.sum(-1) - signed.sum(-2)
        return ds, dc


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

    if order == 'row_col':
        out = along_cols(along_rows(v))
    elif order == 'col_row':
        out = along_rows(along_cols(v))
    else:
        # one column pass serves both orders, Ah [v, Aw v] = [Ah v, Ah Aw v]: with narrow heads the products
        # are bound by reading the attention maps, so each map is read once per pass, not twice
        dv = v.shape[-1]
        both = along_cols(torch.cat([v, along_rows(v)], -1))
        out = 0.5 * both[..., dv:] + 0.5 * along_rows(both[..., :dv])
    return out


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
    m = polyline_mask(la.to(dtype), lb.to(dtype), 'v2h')
    neg_inf = torch.full((), float('-inf'), dtype=dtype, device=q.device)
    a_rows = torch.where(same_row, s + m, neg_inf).softmax(-1)
    a_cols = torch.where(same_col, s + m, neg_inf).softmax(-1)
    row_col = a_cols @ (a_rows @ vf)
    col_row = a_rows @ (a_cols @ vf)
    out = {'row_col': row_col, 'col_row': col_row, 'both': 0.5 * row_col + 0.5 * col_row}[order]
    return out.reshape(*v.shape)


def criss_cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: torch.Tensor,
                          lb: torch.Tensor, scale: float = 1.0, order: str = 'both',
                          impl: str = 'auto') -> torch.Tensor:
    """Decomposed criss-cross masked attention (PPMCCA).

    Row attention ``Aw = softmax(scale * q_row k_row^T + Sa)`` (W x W per row), column attention
    ``Ah = softmax(scale * q_col k_col^T + Sb)`` (H x H per column), with the 1D segment-sum biases.
    order ``'both'``: 0.5 Ah(Aw v) + 0.5 Aw(Ah v) (release); ``'row_col'``: Ah(Aw v) (rows first, RMT);
    ``'col_row'``: Aw(Ah v). Shapes as :func:`ppma_attention`. Never forms an N x N tensor (torch path).
    """
    check_choice('order', order, CRISS_CROSS_ORDERS)
    check_qkv(q, k, v, la, lb)
    impl = resolve_impl(impl, 'criss_cross_attention', (q, k, v), TRITON_OPS)
    if impl == 'triton':
        from .triton import criss_cross_attention_triton
        return criss_cross_attention_triton(q, k, v, la, lb, scale=scale, order=order)
    if impl == 'reference':
        return _criss_cross_reference(q, k, v, la, lb, scale, order).to(v.dtype)
    dtype = table_dtype(q, k, v, la, lb)
    ca, cb = decay_tables(la, lb)
    return _criss_cross_core(q.to(dtype), k.to(dtype), v.to(dtype),
                             lambda s: _SegmentMaskedSoftmax.apply(s, ca),
                             lambda s: _SegmentMaskedSoftmax.apply(s, cb.transpose(-1, -2)), scale,
                             order).to(v.dtype)


def rmt_criss_cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                              scale: float = 1.0, impl: str = 'auto') -> torch.Tensor:
    """RMT's decomposed attention: rows first, then columns, fixed decay ``log_decay * |d|`` per axis.

    log_decay: (heads,) or (B, heads). The bias is built once per head, (heads, W, W) and (heads, H, H).
    """
    check_qkv(q, k, v)
    b, heads, h, w, _ = q.shape
    dtype = table_dtype(q, k, v, log_decay)
    impl = resolve_impl(impl, 'rmt_criss_cross_attention', (q, k, v), TRITON_OPS)
    if impl == 'triton':
        from .triton import rmt_criss_cross_attention_triton
        return rmt_criss_cross_attention_triton(q, k, v, log_decay, scale=scale)
    if impl == 'reference':
        g = log_decay.to(dtype)
        g = (g if g.dim() == 2 else g.unsqueeze(0))[:, :, None, None].expand(b, heads, h, w)
        return criss_cross_attention(q, k, v, g, g, scale, 'row_col', 'reference')
    sa, sb = _manhattan_tables(log_decay, h, w, heads, dtype)
    sa, sb = sa[:, :, :1], sb[:, :, :1]  # one (W, W) and one (H, H) bias per head, broadcast
    return _criss_cross_core(q.to(dtype), k.to(dtype), v.to(dtype), lambda s: s.add_(sa).softmax(-1),
                             lambda s: s.add_(sb).softmax(-1), scale, 'row_col').to(v.dtype)
