"""Whole polyline-path-masked softmax attention (PPMVA): :func:`ppma_attention`, dispatched (:mod:`mmppma.ops.plan`)
to :mod:`.reference` (dense), :mod:`.torch_impl` (branches named by :func:`whole_attention_branch`) or
:mod:`.triton_impl` (fused kernels).

Layouts: q, k (B, heads, H, W, d); v (B, heads, H, W, d_v); log-decays la, lb (B, heads, H, W), <= 0.
All scores, biases and softmaxes are float32 (float64 for float64 inputs); outputs take v's dtype.
"""
import torch

from ..checks import check_whole
from ..devices import triton_available
from ..plan import Op, run
from . import reference, torch_impl
from .torch_impl import whole_attention_branch

if triton_available():  # the Triton paths import triton
    from . import triton_impl
else:  # no implementation resolves to 'triton' (plan.resolve_impl)
    triton_impl = None

__all__ = ['ppma_attention', 'whole_attention_branch']


PPMA_ATTENTION = Op('ppma_attention', check_whole, reference, torch_impl, triton_impl)


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
    return run(PPMA_ATTENTION, (scale, form, tables), impl, q, k, v, la, lb)
