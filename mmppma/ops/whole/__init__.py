"""Whole polyline-path-masked softmax attention (PPMVA): :func:`ppma_attention`, dispatched to
:mod:`.reference` (dense), :mod:`.torch_impl` (branches named by :func:`whole_attention_branch`) or
:mod:`.triton_impl` (fused kernels).

Layouts: q, k (B, heads, H, W, d); v (B, heads, H, W, d_v); log-decays la, lb (B, heads, H, W), <= 0.
All scores, biases and softmaxes are float32 (float64 for float64 inputs); outputs take v's dtype.
"""
import torch

from ..checks import checked_impl
from ..forms import WHOLE_FORMS
from ..masks import column_segment_sums, polyline_mask, row_segment_sums, segment_sum, table_decays
from ..plan import run
from .reference import whole_reference
from .torch_impl import whole_attention_branch, whole_torch

__all__ = ['ppma_attention', 'whole_attention_branch']


def ppma_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, *,
                   scale: float = 1.0, form: str = 'release', tables: bool = False,
                   impl: str = 'auto') -> torch.Tensor:
    """Whole polyline-path-masked softmax attention (PPMVA).

    q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); la, lb: (B, heads, H, W) -> (B, heads, H, W, d_v).
    With S = scale * q k^T and M the V2H log-mask, ``form``:

    * ``'release'``: 0.5 softmax(S + M) v + 0.5 softmax(S + M^T) v (the released checkpoints);
    * ``'paper'``: (softmax(S) * (exp(M) + exp(M^T))) v (paper Eq. 33; no Triton kernel: ``impl='auto'`` takes
      the torch path on GPUs too);
    * ``'v2h'`` / ``'h2v'``: softmax(S + M) v / softmax(S + M^T) v (one path, Table 4 ablation).

    ``tables=True``: la, lb are their decay tables Ca, Cb (:func:`~mmppma.ops.decay_tables`, as
    :func:`~mmppma.ops.path_decay_tables` gives them), float32.

    ``impl='torch'`` takes the branch :func:`whole_attention_branch` names: ``'dense'`` for the paper form,
    ``'autograd'`` (keeps the N x N probabilities) while the B * heads * N^2 score elements fit (a share of a
    GPU's memory; on a CPU ``SMALL_ELEMENTS`` = 2^22 under autograd), ``'blockwise'`` (recomputes them, memory
    O(N^1.5)) or ``'inference'`` (without autograd) above; in an export, ``'export'`` (row by row, as ONNX
    ``Scan``s) on large or dynamic maps, else ``'autograd'``.
    """
    return run('ppma_attention', _plan, (scale, form, tables, impl), q, k, v, la, lb)


def _plan(q, k, v, la, lb, scale: float, form: str, tables: bool, impl: str, traced=None):
    """The call that runs :func:`ppma_attention` on inputs like these (checked here); ``traced`` goes to
    the Triton path."""
    requested, impl = impl, checked_impl('ppma_attention', WHOLE_FORMS, q, k, v, la, lb, form, impl)
    if impl == 'triton':
        from ..triton_support.preflight import plan_with_tables
        from .triton_impl import whole_attention_triton
        return plan_with_tables('ppma_attention', whole_attention_triton, (q, k, v, la, lb), scale, form, tables,
                                requested, ppma_attention, traced)
    if impl == 'reference' or form == 'paper':
        # the paper form multiplies probabilities by the mask after the softmax: no blockwise
        # log-sum-exp trick applies, so its torch path is the dense one
        def dense(q, k, v, la, lb):
            if tables:
                la, lb = table_decays(la, lb)
            return whole_reference(q, k, v, polyline_mask(la, lb, form='v2h'), scale, form)
        return dense
    if tables:
        return lambda q, k, v, ca, cb: whole_torch(q, k, v, segment_sum(ca), segment_sum(cb.transpose(-1, -2)), scale,
                                                   form)
    return lambda q, k, v, la, lb: whole_torch(q, k, v, row_segment_sums(la), column_segment_sums(lb), scale, form)
