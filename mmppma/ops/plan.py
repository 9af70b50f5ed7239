"""Launch plans: the one dispatch path of every op.

Each public op declares itself as an :class:`Op` - its name, the check of its arguments (:mod:`mmppma.ops.checks`)
and the modules that build its paths, one per implementation, beside the code they run (the package's
``reference.py``, ``torch_impl.py``, ``triton_impl.py``) - and hands every call to :func:`run`: the op, its options,
the requested implementation (its ``impl`` argument) and its tensors.

What an op does with its inputs depends on the op, its form and options, the inputs' shapes, strides, dtypes and
device, the grad mode, the TF32 setting (float32 kernels) and the ``MMPPMA_*`` / ``TRITON_INTERPRET`` variables.
In eager mode :func:`run` keys a cache on exactly these (:func:`key`); the first call builds the plan
(:func:`build`): the check, the implementation :func:`~mmppma.ops.dispatch.resolve_impl` resolves the requested one
to, that implementation's path and, for the Triton path of ``impl='auto'`` on a (simulated) GPU, the preflight of
its kernels with the torch path as the fallback (:mod:`mmppma.ops.triton_support.preflight`). Every later call goes
from its inputs to the plan's call. While ``torch.compile`` traces or a model is exported the ops decide per call
(:func:`eager`).
"""
from types import ModuleType
from typing import Callable, NamedTuple, Optional

import torch

from .caches import register_cache
from .dispatch import (
    ENV_VAR,
    SIMULATE_VAR,
    environ_values,
    exporting,
    forced_impl,
    on_gpu,
    resolve_impl,
    tf32_matmul,
)

#: the plans by :func:`key` (a model at one input size and grad mode makes tens)
_PLANS = register_cache('plans', 1024)
#: the variables that steer the ops' choices (their values are part of every plan's key)
_STEERING = (ENV_VAR, SIMULATE_VAR, 'TRITON_INTERPRET')


class Op(NamedTuple):
    """A public op as :func:`run` dispatches it.

    ``check(*tensors, *options)`` checks the arguments and returns the form that
    :func:`~mmppma.ops.dispatch.resolve_impl` looks up (None for an op without forms). Each implementation's path is
    built by a function named after the op, ``<name>_plan``, in its module: ``reference`` and ``torch`` (modules,
    ``builder(*tensors, *options)``) and the module ``triton()`` returns (``builder(*tensors, *options, traced)``),
    imported only when an implementation resolves to it (it imports triton; a static import, which torch.compile
    traces). ``traced``: whether torch.compile traces the call (None: the path asks). A builder returns the plan's
    call, a function of tensors like these."""
    name: str
    check: Callable[..., Optional[str]]
    reference: ModuleType
    torch: ModuleType
    triton: Callable[[], ModuleType]


def eager() -> bool:
    """Whether the ops use their cached plans: not while torch.compile traces (the shapes may be symbolic), nor
    while exporting (:func:`~mmppma.ops.dispatch.exporting`)."""
    return not torch.compiler.is_compiling() and not exporting()


def key(op: str, options: tuple, requested: str, *tensors: torch.Tensor) -> tuple:
    """The cache key of a call of ``op`` with ``options`` (form, scale, ...) and the ``requested`` implementation on
    ``tensors``."""
    parts = [op, options, requested, torch.is_grad_enabled(), environ_values(*_STEERING)]
    float32 = False
    for t in tensors:
        parts.append((t.shape, t.stride(), t.dtype, t.device, t.requires_grad))
        float32 = float32 or t.dtype == torch.float32
    if float32:  # float32 kernels follow the TF32 setting
        parts.append(tf32_matmul())
    return tuple(parts)


def run(op: Op, options: tuple, requested: str, *tensors: torch.Tensor):
    """``op`` on ``tensors``: in eager mode through its plan, built on the first call of a key
    (:func:`build`, ``traced=False``); otherwise through a plan built for this call (``traced=None``: the Triton
    path asks)."""
    if eager():
        plan_key = key(op.name, options, requested, *tensors)
        call = _PLANS.get(plan_key)
        if call is None:
            call = _PLANS[plan_key] = build(op, options, requested, tensors, False)
        return call(*tensors)
    return build(op, options, requested, tensors, None)(*tensors)


def build(op: Op, options: tuple, requested: str, tensors: tuple, traced: Optional[bool]) -> Callable:
    """The plan's call of ``op`` for inputs like ``tensors``: the path of the implementation the ``requested`` one
    resolves to. The Triton path of ``impl='auto'`` (not set through ``MMPPMA_IMPL``) on a (simulated) GPU runs
    only if the preflight finds that its kernels can run there, else the torch path does (one warning); with
    ``impl='triton'`` a kernel that cannot run raises when it launches."""
    form = op.check(*tensors, *options)
    resolved = resolve_impl(requested, op.name, tensors, form)
    builder = op.name + '_plan'
    if resolved == 'reference':
        return getattr(op.reference, builder)(*tensors, *options)
    if resolved == 'torch':
        return getattr(op.torch, builder)(*tensors, *options)
    call = getattr(op.triton(), builder)(*tensors, *options, traced)
    if requested != 'auto' or forced_impl() or not on_gpu(tensors[0]) or torch.compiler.is_compiling():
        # while compiling, the shapes may be symbolic: the kernels run unchecked and raise what a launch raises
        return call
    from .triton_support.preflight import kernels_fit
    return call if kernels_fit(op.name, call, tensors) else getattr(op.torch, builder)(*tensors, *options)
