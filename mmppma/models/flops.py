"""FLOP counting with mmengine's jit-trace counter, plus handlers for the attention ops it misses.

mmengine counts ``aten::matmul``/``linear``/conv, but not ``aten::scaled_dot_product_attention`` nor autograd
Functions (they trace as ``prim::PythonOp.<Name>``). While counting, every whole (N x N) attention of a
:class:`~mmppma.models.layers.attention.PolylinePathAttention` runs as one traced node
(:func:`whole_attention_as_one_op`), whatever path the op takes inside, and is counted as a dense
implementation's two products ``q k^T`` and ``P v`` (one multiply-add = one FLOP, mmengine's / fvcore's
convention; the release form's two masked softmaxes share one ``P v``, as in the paper's 2.71 G for PPMA-T).
Criss-cross attention is plain matmuls and is counted as traced.
"""
import contextlib
import functools
from math import prod
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.nn as nn


class WholeAttentionForFlops(torch.autograd.Function):
    """Forward-only wrapper used by :func:`whole_attention_as_one_op`: traced as
    ``prim::PythonOp.WholeAttentionForFlops`` with inputs q, k, v (B, heads, H, W, d) first, then the decays.
    Every tensor the attention reads is an input (a traced closure over tensors breaks the jit tracer)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: Optional[torch.Tensor],
                lb: Optional[torch.Tensor], attend: Callable[..., torch.Tensor]) -> torch.Tensor:
        return attend(q, k, v, *(t for t in (la, lb) if t is not None))

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError('WholeAttentionForFlops is for FLOP counting only (no backward)')


def _as_one_op(whole_attention: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               *decays: torch.Tensor) -> torch.Tensor:
    la, lb = (tuple(decays) + (None, None))[:2]
    return WholeAttentionForFlops.apply(q, k, v, la, lb, whole_attention)


@contextlib.contextmanager
def whole_attention_as_one_op(model: nn.Module) -> Iterator[None]:
    """While active, the :meth:`~mmppma.models.layers.attention.PolylinePathAttention.attention` of every
    whole-attention layer in ``model`` runs inside :class:`WholeAttentionForFlops`, so a jit trace records it as one
    node however the op computes it internally (blockwise, dense, ...)."""
    from .layers.attention import PolylinePathAttention
    layers = [m for m in model.modules() if isinstance(m, PolylinePathAttention) and m.attn_type == 'whole']
    for layer in layers:  # an instance attribute shadows the method
        layer.attention = functools.partial(_as_one_op, layer.attention)
    try:
        yield
    finally:
        for layer in layers:
            del layer.attention


def attention_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """FLOPs of ``softmax(q k^T) v`` from the op's first three inputs q, k, v.

    q: (B, heads, *query_tokens, d), k: (B, heads, *key_tokens, d), v: (B, heads, *key_tokens, d_v).
    """
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(x) for x in inputs[:3])
    batch = prod(q[:2])
    n_q, n_k = prod(q[2:-1]), prod(k[2:-1])
    return batch * n_q * n_k * (q[-1] + v[-1])


#: Always-registered handles (op names known before tracing; others are found after a first trace).
STATIC_HANDLES = {
    'prim::PythonOp.WholeAttentionForFlops': attention_flop_jit,
    'aten::scaled_dot_product_attention': attention_flop_jit,
}


def _is_attention_python_op(name: str) -> bool:
    return name.startswith('prim::PythonOp.') and 'Attention' in name


def count_flops(model: nn.Module, inputs: Union[torch.Tensor, Tuple[Any, ...]]) -> Tuple[int, Dict[str, int]]:
    """Total FLOPs of ``model(*inputs)`` and the per-operator breakdown, attention included.

    Any other traced ``prim::PythonOp.*Attention*`` (an attention autograd Function outside our layers) is
    counted with :func:`attention_flop_jit` too, at the cost of a second trace.
    """
    from mmengine.analysis import FlopAnalyzer

    inputs = inputs if isinstance(inputs, tuple) else (inputs, )
    with whole_attention_as_one_op(model), torch.no_grad():
        analyzer = FlopAnalyzer(model, inputs).set_op_handle(**STATIC_HANDLES).unsupported_ops_warnings(False)
        analyzer.uncalled_modules_warnings(False)
        analyzer.total()  # runs the trace
        missed = {name for name in analyzer.unsupported_ops() if _is_attention_python_op(name)}
        if missed:
            analyzer.set_op_handle(**{name: attention_flop_jit for name in missed})
        return analyzer.total(), dict(analyzer.by_operator())
