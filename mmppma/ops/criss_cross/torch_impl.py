"""Criss-cross attention, torch path: row attention (W x W maps) and column attention (H x H maps) composed
(:func:`compose_criss_cross`), never an N x N tensor. Without autograd it runs per group of (image, head) maps, on a
CPU the group's maps kept in cache, on a GPU as many as a share of its memory holds (:func:`criss_cross_slices`);
under autograd, eager and without autocast, form 'release' is one autograd.Function with a hand backward
(:class:`SegmentCrissCrossRelease`); otherwise plain autograd. In an export, each image row's and column's maps
on their own, in loops the exporter keeps (:func:`criss_cross_export`), on maps above the export target's threshold
or of a dynamic size; below, the one-shot maps. The torch paths of :func:`~mmppma.ops.criss_cross_attention` and
:func:`~mmppma.ops.rmt_criss_cross_attention`."""
import functools

import torch

from ..checks import table_dtype
from ..export import exporting
from ..line.torch_impl import (
    SegmentMaskedSoftmax,
    padded_segment_bias,
    segment_bias,
    segment_softmax,
    segment_softmax_,
    segment_softmax_backward_,
)
from ..masks import decay_tables, manhattan_segment_sums
from ..torch_support import eager_inference, export_loops, pad_last, padded, scan_slices, score_elements, softmax_

# on a CPU: score elements of one group of (image, head) slices on the no-autograd criss-cross path, so that a
# group's row and column maps stay in cache from their bias to their last product (on a GPU: a share of its memory)
SLICE_ELEMENTS = 1 << 18


def criss_cross_core(q, k, v, row_probs, col_probs, scale, form):
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

    return compose_criss_cross(along_rows, along_cols, v, form)


def criss_cross_export(q, k, v, row_bias, col_bias, scale, form):
    """:func:`criss_cross_core` in the form an export keeps: each image row's attention (B, heads, W, W maps) and
    each image column's (B, heads, H, H) formed, softmaxed and applied on their own
    (:func:`~mmppma.ops.torch_support.scan_slices`, ONNX ``Scan``s when exported), so that the maps stay in cache and
    none is stored. ``row_bias = (add, tables)``: ``add(s, *slices)`` returns the scores s of image row i plus their
    bias, from the i-th slices of ``tables`` (tensors with the image rows first); ``col_bias`` likewise for image
    columns. Form 'release' forms the column maps twice and the row maps once (W x W maps are the larger ones in a
    landscape image)."""
    if scale != 1.0:
        q = q * scale

    def along(bias, lines):
        """Attention along the lines of ``lines`` (the permutation that puts them first, the lines' own tokens
        next to last) for tensors x (B, heads, H, W, c)."""
        add, tables = bias
        q_lines, k_lines = q.permute(lines), k.permute(lines)  # once per direction
        back = [lines.index(dim) for dim in range(5)]

        def attend(x):
            return scan_slices(lambda ql, kl, xl, *t: add(ql @ kl.transpose(-1, -2), *t).softmax(-1) @ xl, q_lines,
                               k_lines, x.permute(lines), *tables).permute(back)
        return attend

    along_rows = along(row_bias, (2, 0, 1, 3, 4))  # lines (H, B, heads, W, c)
    along_cols = along(col_bias, (3, 0, 1, 2, 4))  # lines (W, B, heads, H, c)

    # composed with the roles of rows and columns swapped: 'release' is symmetric in them, and then applies the
    # column attention twice and the row attention once
    return compose_criss_cross(along_cols, along_rows, v, {'h2v': 'v2h', 'v2h': 'h2v'}.get(form, form))


class SegmentCrissCrossRelease(torch.autograd.Function):
    """Criss-cross form ``'release'`` under autograd (torch path): the scores, the in-place segment bias and
    softmax of :class:`~mmppma.ops.line.torch_impl.SegmentMaskedSoftmax` for the row maps (table ``ca``
    (B, heads, H, W)) and the column maps (``cbt`` (B, heads, W, H)), and :func:`compose_criss_cross`'s ops for
    form ``'release'``, with one hand backward. q (pre-scaled), k (B, heads, H, W, d); v (B, heads, H, W, d_v).

    It saves what autograd saves for the same ops (q, k, the tables, both maps' probabilities, [v, Aw v] and
    the column pass [Ah v, Ah Aw v]); its backward forms the row maps' gradient in one product,
    [g, da] @ [Ah v, v]^T (autograd adds two map-sized products: the row maps serve two products), and turns
    each map's gradient into the score gradient in that tensor's own storage.
    """

    @staticmethod
    def forward(ctx, q, k, v, ca, cbt):
        dv = v.shape[-1]
        rows = segment_softmax_(q @ k.transpose(-1, -2), ca)  # (B, heads, H, W, W)
        cols = segment_softmax_(q.transpose(2, 3) @ k.permute(0, 1, 3, 4, 2), cbt)  # (B, heads, W, H, H)
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
        ds_rows, dca = segment_softmax_backward_(drows, rows, ca, ctx.needs_input_grad[3])
        ds_cols, dcbt = segment_softmax_backward_(dcols, cols, cbt, ctx.needs_input_grad[4])
        dq = dk = None
        if ctx.needs_input_grad[0]:
            dq = ds_rows @ k + (ds_cols @ k.transpose(2, 3)).transpose(2, 3)
        if ctx.needs_input_grad[1]:
            dk = ds_rows.transpose(-1, -2) @ q + (ds_cols.transpose(-1, -2) @ q.transpose(2, 3)).transpose(2, 3)
        return dq, dk, dvv, dca, dcbt


def compose_criss_cross(along_rows, along_cols, v: torch.Tensor, form: str) -> torch.Tensor:
    """Criss-cross attention of ``form`` of ``v`` (.., H, W, dv) from row attention ``along_rows`` and column
    attention ``along_cols`` (each maps (.., H, W, c) to (.., H, W, c)): 'h2v' rows first, 'v2h' columns first,
    'release' the mean of both; shared by the torch and Triton paths."""
    if form == 'h2v':
        return along_cols(along_rows(v))
    if form == 'v2h':
        return along_rows(along_cols(v))
    # one column pass serves both orders, Ah [v, Aw v] = [Ah v, Ah Aw v]: with narrow heads the products
    # are bound by reading the attention maps, so each map is read once per pass, not twice
    # 0.5 a + 0.5 b == 0.5 (a + b) exactly (scaling by a power of two)
    dv = v.shape[-1]
    both = along_cols(torch.cat([v, along_rows(v)], -1))
    return (along_rows(both[..., :dv]) + both[..., dv:]).mul_(0.5)


def _slices(b: int, heads: int, per_map: int, device: torch.device):
    """(i0, i1, n0, n1): images [i0, i1) and heads [n0, n1) per group of (image, head) maps, each group about
    :func:`~mmppma.ops.torch_support.score_elements` elements (``SLICE_ELEMENTS`` on a CPU) for ``per_map``
    elements per map: whole images while one image's heads fit, else groups of heads of one image."""
    group = max(1, score_elements(device, SLICE_ELEMENTS) // per_map)
    if group >= heads:
        images = group // heads
        for i0 in range(0, b, images):
            yield i0, min(b, i0 + images), 0, heads
    else:
        for i in range(b):
            for n0 in range(0, heads, group):
                yield i, i + 1, n0, min(heads, n0 + group)


def criss_cross_slices(q, k, v, row_bias, col_bias, scale, form):
    """:func:`criss_cross_core` without autograd, for a group of (image, head) maps at a time (:func:`_slices`),
    so that the group's maps stay in cache from the bias to the last product, while the ops on small maps still
    span several images.

    The maps' rows are :func:`~mmppma.ops.torch_support.padded` (keys padded with zero rows): ``row_bias(s, i0, i1, n0,
    n1)`` adds the bias of images [i0, i1), heads [n0, n1) to row scores s (I, G, H, W, W_pad) in place, -inf in the
    padding, and ``col_bias`` likewise to column scores (I, G, W, H, H_pad). Returns (B, heads, H, W, d_v), a view of a
    (B, H, W, heads, d_v) tensor (the layers' token layout).
    """
    if scale != 1.0:
        q = q * scale
    b, heads, h, w, d = q.shape
    dv = v.shape[-1]
    out = torch.empty(b, h, w, heads, dv, dtype=v.dtype, device=v.device).permute(0, 3, 1, 2, 4)
    slices = list(_slices(b, heads, h * w * max(h, w), q.device))
    images, group = max(i1 - i0 for i0, i1, _, _ in slices), max(n1 - n0 for _, _, n0, n1 in slices)
    # the group's keys along rows (I, G, H, W_pad, d) and along columns (I, G, W, H_pad, d); padding rows stay 0
    k_rows = k.new_zeros(images, group, h, padded(w, k.device), d)
    k_cols = k.new_zeros(images, group, w, padded(h, k.device), d)
    for i0, i1, n0, n1 in slices:
        qg, vg = q[i0:i1, n0:n1], v[i0:i1, n0:n1]  # (I, G, H, W, d)
        kr, kc = k_rows[:i1 - i0, :n1 - n0], k_cols[:i1 - i0, :n1 - n0]
        kr[..., :w, :] = k[i0:i1, n0:n1]
        kc[..., :h, :] = k[i0:i1, n0:n1].transpose(2, 3)
        rows = softmax_(row_bias(qg @ kr.transpose(-1, -2), i0, i1, n0, n1))[..., :w]  # (I, G, H, W, W)
        cols = softmax_(col_bias(qg.transpose(2, 3) @ kc.transpose(-1, -2), i0, i1, n0, n1))[..., :h]
        out[i0:i1, n0:n1] = compose_criss_cross(lambda x: rows @ x,
                                                lambda x: (cols @ x.transpose(2, 3)).transpose(2, 3), vg, form)
    return out


def criss_cross_torch(q, k, v, la, lb, scale: float, form: str, tables: bool = False):
    """:func:`~mmppma.ops.criss_cross_attention` on the torch path (see the module docstring)."""
    dtype = table_dtype(q, k, v, la, lb)
    ca, cb = (la.to(dtype), lb.to(dtype)) if tables else decay_tables(la, lb)
    q, k, v_in = q.to(dtype), k.to(dtype), v.to(dtype)
    if eager_inference(q, k, v_in, la, lb):
        out = criss_cross_slices(q, k, v_in, padded_segment_bias(ca, dtype),
                                 padded_segment_bias(cb.transpose(-1, -2), dtype), scale, form)
    elif exporting():
        if export_loops('criss_cross', ca.shape[-1] * ca.shape[-2]):
            rows = (segment_bias(ca.shape[-1], dtype, q.device), (ca.permute(2, 0, 1, 3), ))
            cols = (segment_bias(cb.shape[-2], dtype, q.device), (cb.permute(3, 0, 1, 2), ))
            out = criss_cross_export(q, k, v_in, rows, cols, scale, form)
        else:
            out = criss_cross_core(q, k, v_in, lambda s: segment_softmax(s, ca),
                                   lambda s: segment_softmax(s, cb.transpose(-1, -2)), scale, form)
    elif form == 'release' and not torch.compiler.is_compiling() and not torch.is_autocast_enabled(q.device.type):
        # eager, no autocast (under autocast the products' dtypes differ): one autograd.Function
        out = SegmentCrissCrossRelease.apply(q * scale if scale != 1.0 else q, k, v_in, ca, cb.transpose(-1, -2))
    else:
        out = criss_cross_core(q, k, v_in, lambda s: SegmentMaskedSoftmax.apply(s, ca),
                               lambda s: SegmentMaskedSoftmax.apply(s, cb.transpose(-1, -2)), scale, form)
    return out.to(v.dtype)


def rmt_criss_cross_torch(q, k, v, log_decay, scale: float):
    """:func:`~mmppma.ops.rmt_criss_cross_attention` on the torch path: one (W, W) and one (H, H) bias per head."""
    b, heads, h, w, _ = q.shape
    dtype = table_dtype(q, k, v, log_decay)
    sa, sb = manhattan_segment_sums(log_decay, h, w, dtype)
    sa, sb = sa[:, :, :1], sb[:, :, :1]  # one (W, W) and one (H, H) bias per head, broadcast
    q, k, v_in = q.to(dtype), k.to(dtype), v.to(dtype)
    if eager_inference(q, k, v_in, log_decay):
        def head_bias(table):  # (B|1, heads, 1, L, L) -> -inf in the padding of the rows
            table = pad_last(table, padded(table.shape[-1], table.device), float('-inf')).expand(b, -1, -1, -1, -1)
            return lambda s, i0, i1, n0, n1: s.add_(table[i0:i1, n0:n1])
        out = criss_cross_slices(q, k, v_in, head_bias(sa), head_bias(sb), scale, 'h2v')
    elif exporting() and export_loops('criss_cross', h * w):
        out = criss_cross_export(q, k, v_in, (lambda s: s + sa[:, :, 0], ()), (lambda s: s + sb[:, :, 0], ()), scale,
                                 'h2v')
    else:
        out = criss_cross_core(q, k, v_in, lambda s: s.add_(sa).softmax(-1), lambda s: s.add_(sb).softmax(-1), scale,
                               'h2v')
    return out.to(v.dtype)


def criss_cross_attention_plan(q, k, v, la, lb, scale: float, form: str, tables: bool):
    """The torch path of :func:`~mmppma.ops.criss_cross_attention` (:class:`~mmppma.ops.plan.Op`)."""
    return functools.partial(criss_cross_torch, scale=scale, form=form, tables=tables)


def rmt_criss_cross_attention_plan(q, k, v, log_decay, scale: float):
    """The torch path of :func:`~mmppma.ops.rmt_criss_cross_attention`."""
    return functools.partial(rmt_criss_cross_torch, scale=scale)
