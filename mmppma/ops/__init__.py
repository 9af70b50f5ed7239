"""Polyline path mask ops: pure functions on tensors (torch, and triton kernels on GPUs), one package per op
family (docs/code_layout.md).

One vocabulary for every op (docs/method.md §2-5 for the math):

* Tensors come first, positionally, channels-last per head: q, k (B, heads, H, W, d); v (B, heads, H, W, d_v);
  ``la`` (horizontal, along W) and ``lb`` (vertical, along H) learned log-decays (B, heads, H, W), <= 0, and
  ``lc`` (along D) for 3D (<= 0 is a contract, not checked: a check would sync with the host; the Triton
  kernels take a segment's log-decay as minus the absolute difference of two cumulative sums, which equals
  the segment sum only under it); ``log_decay`` for a decay that is not per 2D axis: RMT's fixed one per head,
  (heads,) or (B, heads), and the per-token one of a 1D scan, (..., L).
* Then keyword-only, in this order: ``scale`` (of q k^T); ``form``, the path(s) the mask takes
  (:mod:`mmppma.ops.forms`: ``'v2h'``, ``'h2v'``; ``'2d'`` for the summed mask L2D = L + L^T; the softmax
  attentions' ``'release'``, the mean of the two one-path softmaxes, and ``'paper'``); the op's own options;
  ``impl``, the requested implementation (:mod:`mmppma.ops.plan`, whose ``IMPLEMENTATIONS`` lists which op has
  which); tuning knobs (``chunk``).

Every op runs through one dispatch path, its launch plan (:mod:`mmppma.ops.plan`). What the ops remember - launch
plans, the preflight's verdicts, launch parameters, device properties - sits in bounded caches that
:func:`clear_caches` empties (:mod:`mmppma.ops.caches`).

Public op names (stable; what a ``torch.library`` registration uses):

============================ =========================================================================
op                           signature
============================ =========================================================================
ppma_attention               (q, k, v, la, lb, *, scale=1.0, form='release', impl='auto')
criss_cross_attention        (q, k, v, la, lb, *, scale=1.0, form='release', impl='auto')
manhattan_attention          (q, k, v, log_decay, *, scale=1.0, impl='auto')
rmt_criss_cross_attention    (q, k, v, log_decay, *, scale=1.0, impl='auto')
ppma_linear_attention        (q, k, v, la, lb, *, form='2d', feature_map=None, normalize=False,
                             normalizer=None, eps=1e-6, impl='auto', chunk=64)
ppma_decomposed_attention    (s1, s2, v, la, lb, *, form='2d', impl='auto', chunk=64)
polyline_mask_matvec         (x, la, lb, *, form='v2h', impl='auto', chunk=64)
polyline_mask_matvec_3d      (x, la, lb, lc, *, impl='auto', chunk=64)
decay_scan_1d                (x, log_decay, *, impl='auto', chunk=64)
path_decay_tables            (x, weight, dt_bias, a_log, *, impl='auto')  a PPMA layer's decay head -> (Ca, Cb)
polyline_mask                (la, lb, *, form='v2h', space='log', queries=None)  dense rows of the N x N mask
polyline_mask_3d             (la, lb, lc, *, space='log')                dense
manhattan_decay_mask         (log_decay, height, width)                  dense
============================ =========================================================================

plus the table helpers ``decay_tables``, ``segment_sum``, ``row_segment_sums``, ``column_segment_sums``.
"""
from .caches import clear_caches
from .criss_cross import criss_cross_attention, rmt_criss_cross_attention
from .decays import path_decay_tables
from .export import export_mode, export_target, exporting
from .linear import ppma_decomposed_attention, ppma_linear_attention
from .manhattan import manhattan_attention
from .mask3d import polyline_mask_3d, polyline_mask_matvec_3d
from .masks import (
    column_segment_sums,
    decay_tables,
    manhattan_decay_mask,
    polyline_mask,
    row_segment_sums,
    segment_sum,
)
from .plan import IMPLEMENTATIONS, IMPLS, resolve_impl
from .scan import decay_scan_1d, polyline_mask_matvec
from .whole import ppma_attention, whole_attention_branch

#: The public ops, by their stable names.
OPS = ('ppma_attention', 'criss_cross_attention', 'manhattan_attention', 'rmt_criss_cross_attention',
       'ppma_linear_attention', 'ppma_decomposed_attention', 'polyline_mask_matvec', 'polyline_mask_matvec_3d',
       'decay_scan_1d', 'path_decay_tables', 'polyline_mask', 'polyline_mask_3d', 'manhattan_decay_mask')

__all__ = [
    'OPS', 'IMPLS', 'IMPLEMENTATIONS', 'resolve_impl', 'export_mode', 'export_target', 'exporting', 'clear_caches',
    'decay_tables',
    'segment_sum', 'row_segment_sums', 'column_segment_sums', 'whole_attention_branch', 'ppma_attention',
    'criss_cross_attention', 'manhattan_attention', 'rmt_criss_cross_attention', 'ppma_linear_attention',
    'ppma_decomposed_attention', 'polyline_mask_matvec', 'polyline_mask_matvec_3d', 'decay_scan_1d', 'polyline_mask',
    'polyline_mask_3d', 'manhattan_decay_mask', 'path_decay_tables'
]
