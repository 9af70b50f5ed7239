"""FLOP counting with mmengine's jit-trace counter, plus handlers for the attention ops it misses.

mmengine counts ``aten::matmul``/``linear``/conv, but not ``aten::scaled_dot_product_attention`` nor autograd
Functions (they trace as ``prim::PythonOp.<Name>``). While counting, every whole (N x N) attention runs as one
traced node (:func:`~mmppma.models.layers.attention.whole_attention_as_one_op`), whatever path the op takes
inside, and is counted as a dense implementation's two products ``q k^T`` and ``P v`` (one multiply-add = one
FLOP, mmengine's / fvcore's convention; the release form's two masked softmaxes share one ``P v``, as in the
paper's 2.71 G for PPMA-T). Criss-cross attention is plain matmuls and is counted as traced.
"""
from math import prod
from typing import Any, Dict, List, Tuple, Union

import torch
import torch.nn as nn


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

    from ..layers.attention import whole_attention_as_one_op
    inputs = inputs if isinstance(inputs, tuple) else (inputs, )
    with whole_attention_as_one_op(), torch.no_grad():
        analyzer = FlopAnalyzer(model, inputs).set_op_handle(**STATIC_HANDLES).unsupported_ops_warnings(False)
        analyzer.uncalled_modules_warnings(False)
        analyzer.total()  # runs the trace
        missed = {name for name in analyzer.unsupported_ops() if _is_attention_python_op(name)}
        if missed:
            analyzer.set_op_handle(**{name: attention_flop_jit for name in missed})
        return analyzer.total(), dict(analyzer.by_operator())
