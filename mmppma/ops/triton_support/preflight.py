"""The preflight of the Triton paths and the one rule of their torch fallback: ``impl='auto'`` falls back only for
what is found before any kernel runs. Once per input signature on a (simulated) GPU, an op's launches are recorded
on ``meta`` tensors (:func:`mmppma.ops.triton_support.launch.recording`), their grids checked against CUDA's limits,
and each kernel compiled and loaded. What keeps them from running (:data:`CANNOT_RUN`) makes the op take its torch
path with one warning naming the op, the shape, the dtype and the GPU. Everything raised while the kernels run,
forward or backward, is an error: an out-of-memory or CUDA error as it is, anything else as
:class:`KernelLaunchError`; nothing learnt at run time is remembered. ``impl='triton'`` (or ``MMPPMA_IMPL=triton``)
has no fallback: a kernel that cannot run raises :class:`KernelLaunchError` too.
"""
import contextlib
import os
import warnings
from typing import Callable, Dict, Iterator, Optional, Sequence

import torch
from triton.runtime.errors import TritonError

from ..dispatch import ENV_VAR, device_capability, device_name, on_gpu
from . import launch

#: what the preflight finds that keeps the kernels from running on the user's GPU: a compile or resource error
#: (``TritonError``: out of shared memory, a ``CompilationError``, ptxas), a grid over CUDA's limits, a binary the
#: driver cannot load (a driver too old for the PTX)
CANNOT_RUN = (TritonError, launch.LaunchLimitError, launch.KernelLoadError)


class KernelLaunchError(RuntimeError):
    """A failure of a Triton path (other than an out-of-memory or CUDA error), naming the op, shape, dtype and
    GPU; or, under ``impl='triton'``, kernels that cannot run on the inputs' GPU."""


#: (op, device, capability, shapes and dtypes) -> None (the kernels run) or what the preflight found
_PREFLIGHT: Dict[tuple, Optional[Exception]] = {}


def fallback_for(impl: str, torch_path: Callable[..., torch.Tensor]) -> Optional[Callable[..., torch.Tensor]]:
    """The torch path to fall back on when the preflight finds that a kernel cannot run on the user's GPU: only
    for ``impl='auto'`` (not forced to triton through the environment); ``impl='triton'`` raises instead."""
    return torch_path if impl == 'auto' and not os.environ.get(ENV_VAR, '').strip() else None


def is_device_error(error: BaseException) -> bool:
    """Whether ``error`` is the device's own (out of memory, or a CUDA error, which may have been left by an
    earlier kernel): it propagates as it is, never blamed on an op."""
    if isinstance(error, (torch.OutOfMemoryError, torch.AcceleratorError)):
        return True
    return isinstance(error, RuntimeError) and str(error).startswith('Triton Error [CUDA]')  # triton's launcher


def _key(op: str, inputs: Sequence[torch.Tensor]) -> tuple:
    q = inputs[0]
    return (op, q.device, device_capability(q.device), *((tuple(t.shape), t.dtype) for t in inputs))


def _describe(op: str, q: torch.Tensor) -> str:
    return f'{op}: the Triton kernels on {device_name(q.device)} for inputs {tuple(q.shape)} {q.dtype}'


def _first_line(error: Exception) -> str:
    return f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'


def check_launches(run: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], device: torch.device) -> None:
    """Record every launch of ``run`` (forward and backward) on ``meta`` tensors shaped as ``inputs``, check the
    grids and compile and load each launch for ``device`` (:meth:`Launch.prepare`); raise what a launch would.
    Any grad mode: the meta tensors are made outside the caller's inference mode, with autograd on."""
    with torch.inference_mode(False), torch.enable_grad():
        meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device='meta',
                                    requires_grad=t.is_floating_point()) for t in inputs]
        with launch.recording(launch.capability(device)) as launches:
            outs = run(*meta)
            outs = outs if isinstance(outs, tuple) else (outs, )
            torch.autograd.grad(outs, [t for t in meta if t.requires_grad], [torch.empty_like(o) for o in outs],
                                allow_unused=True)
    for item in launches:
        item.check_grid()
    for item in launches:
        item.prepare(device)


def kernel_failure(op: str, q: torch.Tensor, where: str, error: Exception) -> Exception:
    """What a failure ``error`` of the Triton path of ``op`` (inputs like ``q``) raises: on a (simulated) GPU a
    :class:`KernelLaunchError` naming the op, the shape, the dtype, the GPU and ``where`` it happened; an
    out-of-memory or CUDA error, or any error on the interpreter, as it is."""
    if is_device_error(error) or not on_gpu(q):
        return error
    if isinstance(error, KernelLaunchError):  # raised by an op this one is made of
        return KernelLaunchError(f'{_describe(op, q)}: in {error}')
    return KernelLaunchError(f"{_describe(op, q)} failed {where}: {_first_line(error)}; impl='torch' runs the torch "
                             f"path")


def raise_named(op: str, q: torch.Tensor, where: str, error: Exception) -> None:
    """Raise :func:`kernel_failure`'s error for ``error`` (from ``error`` when it is another)."""
    named = kernel_failure(op, q, where, error)
    if named is error:
        raise error
    raise named from error


class KernelFunction(torch.autograd.Function):
    """A Triton path's forward and backward as one autograd node, for eager calls (no library op's dispatch):
    ``KernelFunction.apply((forward, backward, count), op, *inputs)``. The first ``count`` inputs are tensors, the
    rest plain arguments. ``forward(*inputs)`` returns (output, *extra) and the node saves the tensors and the
    extra; ``backward(grad, *tensors, *extra, *arguments)`` returns the tensors' gradients. A missing output
    gradient is no work; failures raise as :func:`raise_named` names them, for the public ``op``."""

    @staticmethod
    def forward(ctx, kernels, op, *inputs):
        forward, _, count = kernels
        ctx.set_materialize_grads(False)
        try:
            out, *extra = forward(*inputs)
        except Exception as e:
            raise_named(op, inputs[0], 'while running', e)
        ctx.save_for_backward(*inputs[:count], *extra)
        ctx.kernels, ctx.op, ctx.arguments = kernels, op, inputs[count:]
        return out

    @staticmethod
    def backward(ctx, grad):
        nothing = (None, ) * len(ctx.arguments)
        if grad is None:
            return (None, None, *(None, ) * ctx.kernels[2], *nothing)
        tensors = ctx.saved_tensors
        try:
            grads = ctx.kernels[1](grad, *tensors, *ctx.arguments)
        except Exception as e:
            raise_named(ctx.op, tensors[0], 'in the backward', e)
        return (None, None, *grads, *nothing)


def call_kernels(op: str, library_op: Callable, kernels: tuple, infer: Callable, traced: Optional[bool], *inputs):
    """A Triton path's output for ``inputs`` (tensors first, ``kernels[2]`` of them, then plain arguments): the
    ``torch.library`` op while torch.compile traces (``traced``; None: ask), the :class:`KernelFunction` node
    ``kernels`` while autograd records on an input tensor, else ``infer(*inputs)[0]`` (the forward's outputs, nothing
    saved), failures named for the public ``op``."""
    if torch.compiler.is_compiling() if traced is None else traced:
        return library_op(*inputs)[0]
    if torch.is_grad_enabled():
        for t in inputs[:kernels[2]]:
            if t.requires_grad:
                return KernelFunction.apply(kernels, op, *inputs)
    try:
        return infer(*inputs)[0]
    except Exception as e:
        raise_named(op, inputs[0], 'while running', e)


@contextlib.contextmanager
def failures_named(op: str, inputs: Sequence[torch.Tensor], where: str) -> Iterator[None]:
    """Within the block, a failure of the Triton path raises :func:`kernel_failure`'s error."""
    try:
        yield
    except Exception as e:
        raise_named(op, inputs[0], where, e)


def kernels_fit(op: str, run: Callable[..., torch.Tensor], inputs, fallback) -> bool:
    """Whether every kernel launch of ``run`` can run on the inputs' GPU (:func:`check_launches`), found once per
    (op, shapes, dtypes, device); if not, the one warning. With no ``fallback`` (or no GPU) this is not asked:
    the launches raise themselves."""
    q = inputs[0]
    if fallback is None or not on_gpu(q) or torch.compiler.is_compiling():
        # while compiling, the shapes may be symbolic: the kernels run unchecked and raise what a launch raises
        return True
    key = _key(op, inputs)
    if key not in _PREFLIGHT:
        with failures_named(op, inputs, 'in the preflight, before any kernel ran'):  # what is not CANNOT_RUN
            try:
                check_launches(run, inputs, q.device)
                _PREFLIGHT[key] = None
            except CANNOT_RUN as e:
                _PREFLIGHT[key] = e
                warnings.warn(f"{_describe(op, q)} cannot run ({_first_line(e)}); impl='auto' falls back to "
                              f"impl='torch' for these inputs")
    return _PREFLIGHT[key] is None


class _NamedBackward(torch.autograd.Function):
    """The Triton path's output, whose backward names the op, shape, dtype and GPU when it fails
    (:func:`failures_named`)."""

    @staticmethod
    def forward(ctx, op, run, *inputs):
        ctx.op = op
        with torch.enable_grad():
            ctx.inputs = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
            ctx.out = run(*ctx.inputs)
        return ctx.out.detach()

    @staticmethod
    def backward(ctx, grad):
        inputs, out = ctx.inputs, ctx.out
        ctx.out = None  # the kernels' graph is freed with their backward
        with failures_named(ctx.op, inputs, 'in the backward'):
            grads = iter(torch.autograd.grad(out, [t for t in inputs if t.requires_grad], grad, allow_unused=True))
        return (None, None, *(next(grads) if t.requires_grad else None for t in inputs))


def run_or_fall_back(op: str, run: Callable[..., torch.Tensor], inputs, impl: str,
                     torch_path: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``run(*inputs)`` (the op's Triton path) if the preflight finds that its kernels can run on the inputs' GPU
    (:func:`kernels_fit`), else ``torch_path(*inputs)`` for the requested ``impl`` (:func:`fallback_for`). A
    failure while the kernels run, forward or backward, raises (:func:`failures_named`)."""
    fallback = fallback_for(impl, torch_path)
    if not kernels_fit(op, run, inputs, fallback):
        return fallback(*inputs)
    if not on_gpu(inputs[0]) or torch.compiler.is_compiling():
        return run(*inputs)
    with failures_named(op, inputs, 'while running'):
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            return _NamedBackward.apply(op, run, *inputs)
        return run(*inputs)


def triton_plan(op: str, run: Callable[..., torch.Tensor], inputs, impl: str,
                torch_path: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The call of a plan (:mod:`mmppma.ops.plan`) for inputs like ``inputs`` of an op whose Triton path is
    ``run``, which names its own failures (:func:`raise_named`): ``run`` if the preflight finds that its kernels
    can run on the inputs' GPU (:func:`kernels_fit`), else the torch path for the requested ``impl``
    (:func:`fallback_for`)."""
    fallback = fallback_for(impl, torch_path)
    return run if kernels_fit(op, run, inputs, fallback) else fallback


def plan_with_tables(op: str, kernel: Callable[..., torch.Tensor], inputs, scale: float, form: str, tables: bool,
                     impl: str, torch_op: Callable[..., torch.Tensor],
                     traced: Optional[bool]) -> Callable[..., torch.Tensor]:
    """:func:`triton_plan` for an op of (q, k, v, la, lb) whose Triton path is ``kernel(q, k, v, Ca, Cb, scale,
    form, op, traced)`` on the decay tables of la, lb, or on la, lb themselves with ``tables`` (whole and criss-cross
    attention); ``torch_op`` is the op itself, called with ``impl='torch'`` for the fallback."""
    from ..masks import decay_tables
    if tables:
        def run(q, k, v, ca, cb):
            return kernel(q, k, v, ca, cb, scale, form, op, traced)
    else:
        def run(q, k, v, la, lb):
            return kernel(q, k, v, *decay_tables(la, lb), scale, form, op, traced)
    return triton_plan(op, run, inputs, impl, lambda *t: torch_op(*t, scale=scale, form=form, tables=tables,
                                                                  impl='torch'))
