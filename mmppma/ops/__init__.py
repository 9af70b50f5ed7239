"""Polyline path mask ops: pure functions on tensors (torch, and triton kernels on GPUs).

Layouts are channels-last per head: q, k (B, heads, H, W, d); v (B, heads, H, W, d_v); log-decays
la (horizontal) and lb (vertical) (B, heads, H, W), <= 0. See REFERENCE 2-4 for the math and
:mod:`mmppma.ops.dispatch` for ``impl``.
"""
from .attention import (criss_cross_attention, manhattan_attention, ppma_attention,
                        rmt_criss_cross_attention)
from .dispatch import IMPLS, resolve_impl
from .linear_attention import ppma_decomposed_attention, ppma_linear_attention
from .polyline_mask import (column_segment_sums, decay_tables, manhattan_decay_mask, polyline_mask,
                            polyline_mask_3d, row_segment_sums, segment_sum)
from .scan import decay_scan_1d, polyline_mask_matvec, polyline_mask_matvec_3d

__all__ = [
    'IMPLS', 'resolve_impl', 'decay_tables', 'segment_sum', 'row_segment_sums', 'column_segment_sums',
    'polyline_mask', 'polyline_mask_3d', 'manhattan_decay_mask', 'decay_scan_1d', 'polyline_mask_matvec',
    'polyline_mask_matvec_3d', 'ppma_attention', 'criss_cross_attention', 'manhattan_attention',
    'rmt_criss_cross_attention', 'ppma_decomposed_attention', 'ppma_linear_attention'
]
