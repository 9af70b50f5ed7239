"""Launch plans: the one dispatch path of every op, and where its implementation is chosen.

Each public op declares itself as an :class:`Op` - its name, the check of its arguments (:mod:`mmppma.ops.checks`)
and the modules that build its paths, one per implementation, beside the code they run (the package's
``reference.py``, ``torch_impl.py``, ``triton_impl.py``) - and hands every call to :func:`run`: the op, its options,
the requested implementation (its ``impl`` argument) and its tensors.

An op is called with ``impl``, the *requested* implementation, one of the four below; :func:`resolve_impl` turns it
into the *resolved* one, which the op runs: 'torch', 'triton' or 'reference', never 'auto'. ``impl`` is one of:

* ``'reference'`` - dense and obviously correct: forms the whole N x N mask (test oracle);
* ``'torch'`` - PyTorch: masks assembled from segment-sum tables, never an N x N mask for the scans and
  criss-cross attention; whole attention's size-chosen branches are named by
  :func:`mmppma.ops.whole_attention_branch`;
* ``'triton'`` - fused GPU kernels (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``; ``meta`` tensors
  describe the launches without running them);
* ``'auto'`` - triton for CUDA tensors when a kernel exists, triton imports and the GPU's capability has a launch
  table (:data:`~mmppma.ops.devices.CAPABILITIES`; one warning per other capability), torch otherwise. The
  environment variable ``MMPPMA_IMPL`` (one of the above) overrides ``'auto'`` everywhere, for A/B runs without
  touching configs. While a model is exported (:mod:`mmppma.ops.export`) every op resolves to ``'torch'``.

What an op does with its inputs depends on the op, its form and options, the inputs' shapes, strides, dtypes and
device, the grad mode, the TF32 setting (float32 kernels) and the ``MMPPMA_*`` / ``TRITON_INTERPRET`` variables.
In eager mode :func:`run` keys a cache on exactly these (:func:`key`); the first call builds the plan
(:func:`build`): the check, the resolved implementation, its path and, for the Triton path of ``impl='auto'`` on a
(simulated) GPU, the preflight of its kernels with the torch path as the fallback
(:mod:`mmppma.ops.triton_support.preflight`). Every later call goes from its inputs to the plan's call. While
``torch.compile`` traces or a model is exported the ops decide per call (:func:`eager`).
"""
import warnings
from types import ModuleType
from typing import Callable, Dict, Iterable, NamedTuple, Optional, Tuple

import torch

from .caches import register_cache
from .devices import (
    CAPABILITIES,
    SIMULATE_VAR,
    device_capability,
    device_name,
    environ,
    environ_values,
    on_gpu,
    tf32_matmul,
    triton_available,
    triton_interpreted,
)
from .export import exporting
from .forms import CRISS_CROSS_FORMS, MASK_FORMS, WHOLE_FORMS

IMPLS = ('auto', 'torch', 'triton', 'reference')
ENV_VAR = 'MMPPMA_IMPL'
#: the plans by :func:`key` (a model at one input size and grad mode makes tens)
_PLANS = register_cache('plans', 1024)
#: the variables that steer the ops' choices (their values are part of every plan's key)
_STEERING = (ENV_VAR, SIMULATE_VAR, 'TRITON_INTERPRET')
class Op(NamedTuple):
    """A public op as :func:`run` dispatches it.

    ``check(*tensors, *options)`` checks the arguments and returns the form that
    :func:`resolve_impl` looks up (None for an op without forms). Each implementation's path is built by a function
    named after the op, ``<name>_plan``, in its module: ``reference`` and ``torch`` (``builder(*tensors,
    *options)``) and ``triton`` (``builder(*tensors, *options, traced)``; None where triton does not import, and
    then no implementation resolves to it). ``traced``: whether torch.compile traces the call (None: the path asks).
    A builder returns the plan's call, a function of tensors like these."""
    name: str
    check: Callable[..., Optional[str]]
    reference: ModuleType
    torch: ModuleType
    triton: Optional[ModuleType]


def eager() -> bool:
    """Whether the ops use their cached plans: not while torch.compile traces (the shapes may be symbolic), nor
    while exporting (:func:`~mmppma.ops.export.exporting`)."""
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
    call = getattr(op.triton, builder)(*tensors, *options, traced)
    if requested != 'auto' or forced_impl() or not on_gpu(tensors[0]) or torch.compiler.is_compiling():
        # while compiling, the shapes may be symbolic: the kernels run unchecked and raise what a launch raises
        return call
    from .triton_support.preflight import kernels_fit
    return call if kernels_fit(op.name, call, tensors) else getattr(op.torch, builder)(*tensors, *options)


_ALL = ('reference', 'torch', 'triton')
_NO_KERNEL = ('reference', 'torch')
#: The implementations of every public op that takes ``impl``, per ``form`` (None: the op takes no form): the
#: one table :func:`resolve_impl` reads. The matvecs run their 1D scans on the Triton scan kernel, the linear /
#: decomposed attention the fused PPMLA kernels; whole attention's paper form (probabilities times the mask after
#: the softmax) has no kernel.
IMPLEMENTATIONS_BY_FORM: Dict[Tuple[str, Optional[str]], Tuple[str, ...]] = {
    **{('ppma_attention', form): _NO_KERNEL if form == 'paper' else _ALL for form in WHOLE_FORMS},
    **{('criss_cross_attention', form): _ALL for form in CRISS_CROSS_FORMS},
    **{(op, form): _ALL for op in ('ppma_decomposed_attention', 'ppma_linear_attention', 'polyline_mask_matvec')
       for form in MASK_FORMS},
    **{(op, None): _ALL for op in ('manhattan_attention', 'rmt_criss_cross_attention', 'decay_scan_1d',
                                   'polyline_mask_matvec_3d', 'path_decay_tables')},
}
#: Derived from :data:`IMPLEMENTATIONS_BY_FORM`: the implementations each op has for at least one form.
IMPLEMENTATIONS: Dict[str, Tuple[str, ...]] = {
    op: tuple(impl for impl in _ALL if any(impl in impls for (name, _), impls in IMPLEMENTATIONS_BY_FORM.items()
                                           if name == op))
    for op, _ in IMPLEMENTATIONS_BY_FORM
}




def resolve_impl(requested: str, op: str, tensors: Iterable[torch.Tensor], form: Optional[str] = None) -> str:
    """The implementation an op runs, resolved ('torch' | 'triton' | 'reference'; never 'auto'), from the one it is
    called with, ``requested`` (its ``impl`` argument: one of :data:`IMPLS`), for ``op`` in ``form`` (a key of
    :data:`IMPLEMENTATIONS_BY_FORM`; ``form=None`` for an op that takes forms: what any of its forms has) and the
    device of ``tensors``."""
    if op not in IMPLEMENTATIONS:
        raise KeyError(f'{op!r} is not an op with implementations; the ops are {", ".join(IMPLEMENTATIONS)}')
    if form is None:
        impls = IMPLEMENTATIONS[op]
    elif (op, form) in IMPLEMENTATIONS_BY_FORM:
        impls = IMPLEMENTATIONS_BY_FORM[op, form]
    else:
        raise ValueError(f'{op}: form={form!r} is not one of its forms '
                         f'{", ".join(repr(f) for name, f in IMPLEMENTATIONS_BY_FORM if name == op)}')
    if requested not in IMPLS:
        raise ValueError(f'impl={requested!r} is not supported; choose one of {", ".join(map(repr, IMPLS))}')
    resolved = requested
    if requested == 'auto':
        forced = forced_impl()
        if forced:
            if forced not in IMPLS:
                raise ValueError(f'{ENV_VAR}={forced!r} is not supported; set it to one of '
                                 f'{", ".join(IMPLS)} or unset it')
            resolved = forced
    if exporting() and resolved in ('auto', 'triton'):
        return 'torch'
    tensors = list(tensors)
    gpu = next((t.device for t in tensors if on_gpu(t)), None)
    on_cuda = gpu is not None
    has_kernel = 'triton' in impls
    if resolved == 'auto':
        return 'triton' if (on_cuda and has_kernel and triton_available() and _tabled(gpu)) else 'torch'
    if resolved == 'triton':
        if on_cuda and device_capability(gpu) not in CAPABILITIES:
            raise RuntimeError(f"{op}: {_untabled(gpu)}; use impl='auto' or impl='torch' on this GPU")
        if not has_kernel:
            raise NotImplementedError(
                f"{op}: no Triton kernel exists for {f'form={form!r}' if form else 'this op'}; use impl='torch' "
                f"(fast PyTorch) or impl='reference' (dense), or impl='auto'")
        if not triton_available():
            raise RuntimeError(f"{op}: impl='triton' needs the triton package (pip install triton); "
                               f"use impl='torch' or impl='auto' instead")
        if not on_cuda and not triton_interpreted() and not all(t.device.type == 'meta' for t in tensors):
            raise RuntimeError(f"{op}: impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                               f"triton is imported, for CPU debugging); use impl='torch' or impl='auto' "
                               f"on this device")
    return resolved


def forced_impl() -> str:
    """What ``MMPPMA_IMPL`` sets ``impl='auto'`` to; '' when it is unset."""
    return (environ(ENV_VAR) or '').strip()


#: the capabilities without a launch table whose one warning was given
_WARNED_UNTABLED = register_cache('untabled_warnings', 16)


def _untabled(device: torch.device) -> str:
    return (f'the Triton kernels have no launch table for sm_{device_capability(device)} ({device_name(device)}): '
            f'tools/check_kernels.py proves tables for {", ".join(f"sm_{c}" for c in CAPABILITIES)} only')


def _tabled(device: torch.device) -> bool:
    """Whether the GPU's capability has a launch table; for one without, the one warning per capability."""
    cap = device_capability(device)
    if cap in CAPABILITIES:
        return True
    if cap not in _WARNED_UNTABLED:
        _WARNED_UNTABLED[cap] = True
        warnings.warn(f"{_untabled(device)}; impl='auto' takes the torch path on this GPU")
    return False
