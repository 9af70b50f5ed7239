"""Launch plans: an op call's host work decided once per call site.

What an op does with its inputs depends on the op, its form and options, the inputs' shapes, strides, dtypes and
device, the grad mode, the TF32 setting (float32 kernels) and the ``MMPPMA_*`` / ``TRITON_INTERPRET`` variables.
In eager mode the ops key a cache on exactly these (:func:`key`); the first call builds the plan - checks, the
implementation :func:`~mmppma.ops.dispatch.resolve_impl` picks, the preflight of the kernels, the torch fallback -
and every later call goes from its inputs to the plan's call. While ``torch.compile`` traces or a model is exported
the ops decide per call (:func:`eager`).
"""
from typing import Callable, Dict

import torch

from .dispatch import ENV_VAR, SIMULATE_VAR, environ_values, exporting, tf32_matmul

_PLANS: Dict[tuple, Callable] = {}


#: the variables that steer the ops' choices (their values are part of every plan's key)
_STEERING = (ENV_VAR, SIMULATE_VAR, 'TRITON_INTERPRET')


def eager() -> bool:
    """Whether the ops use their cached plans: not while torch.compile traces (the shapes may be symbolic), nor
    while exporting (:func:`~mmppma.ops.dispatch.exporting`)."""
    return not torch.compiler.is_compiling() and not exporting()


def key(op: str, options: tuple, *tensors: torch.Tensor) -> tuple:
    """The cache key of a call of ``op`` with ``options`` (form, scale, impl, ...) on ``tensors``."""
    parts = [op, options, torch.is_grad_enabled(), environ_values(*_STEERING)]
    float32 = False
    for t in tensors:
        parts.append((t.shape, t.stride(), t.dtype, t.device, t.requires_grad))
        float32 = float32 or t.dtype == torch.float32
    if float32:  # float32 kernels follow the TF32 setting
        parts.append(tf32_matmul())
    return tuple(parts)


def run(op: str, build: Callable[..., Callable], options: tuple, *tensors: torch.Tensor) -> torch.Tensor:
    """``op`` on ``tensors``: in eager mode through its plan, ``build(*tensors, *options, traced=False)`` on the
    first call of a key; otherwise through a plan built for this call (``traced=None``: the Triton path asks)."""
    if eager():
        plan_key = key(op, options, *tensors)
        plan = _PLANS.get(plan_key)
        if plan is None:
            plan = _PLANS[plan_key] = build(*tensors, *options, traced=False)
        return plan(*tensors)
    return build(*tensors, *options, traced=None)(*tensors)
