"""FLOP counting with mmengine's jit-trace counter, plus handlers for the attention ops it misses.

mmengine counts ``aten::matmul``/``linear``/conv, but not ``aten::scaled_dot_product_attention`` nor the
memory-lean autograd Functions of :mod:`mmppma.ops` (they trace as ``prim::PythonOp.<Name>``). For those we
count what a dense implementation's matmuls would: ``q k^T`` and ``P v``, one multiply-add = one FLOP
(mmengine's / fvcore's convention), independent of how many masked softmaxes share the ``P v`` product.
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
    'aten::scaled_dot_product_attention': attention_flop_jit,
    'prim::PythonOp._MaskedSoftmaxAttention': attention_flop_jit,  # mmppma.ops whole attention, torch path
}


def _is_attention_python_op(name: str) -> bool:
    return name.startswith('prim::PythonOp.') and 'Attention' in name


def count_flops(model: nn.Module, inputs: Union[torch.Tensor, Tuple[Any, ...]]) -> Tuple[int, Dict[str, int]]:
    """Total FLOPs of ``model(*inputs)`` and the per-operator breakdown, attention included.

    Any traced ``prim::PythonOp.*Attention*`` (an mmppma op's autograd Function) is counted with
    :func:`attention_flop_jit`; this costs a second trace only when such an op is present.
    """
    from mmengine.analysis import FlopAnalyzer
    inputs = inputs if isinstance(inputs, tuple) else (inputs, )
    analyzer = FlopAnalyzer(model, inputs).set_op_handle(**STATIC_HANDLES).unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    analyzer.total()  # runs the trace
    missed = {name for name in analyzer.unsupported_ops() if _is_attention_python_op(name)}
    if missed:
        analyzer.set_op_handle(**{name: attention_flop_jit for name in missed})
    return analyzer.total(), dict(analyzer.by_operator())
