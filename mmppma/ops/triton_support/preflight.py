"""The preflight of the Triton paths and their torch fallback: before an ``impl='auto'`` op first launches its
kernels for an input signature on a (simulated) GPU, its launches are recorded on ``meta`` tensors
(:func:`mmppma.ops.triton_support.launch.recording`), checked against the grid limits, and compiled and loaded
once. Where one cannot run - a ``TritonError`` (out of resources, a compile error), a driver ``RuntimeError``, a
grid over the limits - or a launch fails, forward or backward, the op falls back to its torch path with one warning
naming the op, the shape, the dtype and the GPU. ``impl='triton'`` (or ``MMPPMA_IMPL=triton``) raises instead.
"""
import os
import warnings
from typing import Callable, Dict, Optional, Sequence

import torch
from triton.runtime.errors import TritonError

from ..dispatch import ENV_VAR, device_capability, device_name, on_gpu
from . import launch

#: what a kernel that cannot compile, load or launch on the user's GPU raises (a grid over the limits included:
#: :class:`mmppma.ops.triton_support.launch.LaunchLimitError` is a RuntimeError)
CANNOT_RUN = (TritonError, RuntimeError)


class KernelLaunchError(RuntimeError):
    """A Triton path that failed on the inputs' GPU under ``impl='triton'``, naming the op, shape, dtype and GPU."""


#: (op, device, capability, shapes and dtypes) -> None (the kernels run) or what kept them from running
_PREFLIGHT: Dict[tuple, Optional[Exception]] = {}


def fallback_for(impl: str, torch_path: Callable[..., torch.Tensor]) -> Optional[Callable[..., torch.Tensor]]:
    """The torch path to fall back on when a kernel cannot compile or launch on the user's GPU: only for
    ``impl='auto'`` (not forced to triton through the environment); ``impl='triton'`` raises instead."""
    return torch_path if impl == 'auto' and not os.environ.get(ENV_VAR, '').strip() else None


def _key(op: str, inputs: Sequence[torch.Tensor]) -> tuple:
    q = inputs[0]
    return (op, q.device, device_capability(q.device), *((tuple(t.shape), t.dtype) for t in inputs))


def _describe(op: str, q: torch.Tensor) -> str:
    return f'{op}: the Triton kernels cannot run on {device_name(q.device)} for inputs {tuple(q.shape)} {q.dtype}'


def _failed(key: tuple, op: str, q: torch.Tensor, error: Exception) -> None:
    """Remember that the kernels cannot run for ``key``, with the one warning."""
    _PREFLIGHT[key] = error
    first = str(error).splitlines()[0] if str(error) else ''
    warnings.warn(f"{_describe(op, q)} ({type(error).__name__}: {first}); impl='auto' falls back to impl='torch' "
                  f"for these inputs")


def check_launches(run: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], device: torch.device) -> None:
    """Record every launch of ``run`` (forward and backward) on ``meta`` tensors shaped as ``inputs``, check the
    grids and, on a GPU, compile and load each launch on ``device``; raise what a launch would. Any grad mode:
    the meta tensors are made outside the caller's inference mode, with autograd on."""
    with torch.inference_mode(False), torch.enable_grad():
        meta = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device='meta',
                                    requires_grad=t.is_floating_point()) for t in inputs]
        with launch.recording(launch.capability(device)) as launches:
            out = run(*meta)
            torch.autograd.grad(out, [t for t in meta if t.requires_grad], torch.empty_like(out), allow_unused=True)
    for item in launches:
        item.check_grid()
    if device.type == 'cuda':  # the simulated device (CPU tensors) has no GPU to compile for and load on
        with torch.cuda.device(device):
            for item in launches:
                item.prepare()


def kernels_fit(op: str, run: Callable[..., torch.Tensor], inputs, fallback) -> bool:
    """Whether every kernel launch of ``run`` fits the inputs' GPU (:func:`check_launches`), found once per
    (op, shapes, dtypes, device). With no ``fallback`` (or no GPU) this is not asked: the launches raise
    themselves."""
    q = inputs[0]
    if fallback is None or not on_gpu(q) or torch.compiler.is_compiling():
        # while compiling, the shapes may be symbolic: the kernels run unchecked and raise what a launch raises
        return True
    key = _key(op, inputs)
    if key not in _PREFLIGHT:
        try:
            check_launches(run, inputs, q.device)
            _PREFLIGHT[key] = None
        except CANNOT_RUN as e:
            _failed(key, op, q, e)
    return _PREFLIGHT[key] is None


def _launch_error(op: str, q: torch.Tensor, error: Exception) -> KernelLaunchError:
    """What a failing launch raises without a fallback, naming the op, shape, dtype and GPU."""
    if isinstance(error, KernelLaunchError):  # in an op this one is made of
        return KernelLaunchError(f'{_describe(op, q)}: in {error}')
    return KernelLaunchError(f"{_describe(op, q)}: {type(error).__name__}: {error}; impl='auto' falls back to the "
                             f"torch path, impl='torch' runs it")


class _GuardedBackward(torch.autograd.Function):
    """The Triton path's output whose backward, when one of its launches fails, takes the gradients of the torch
    path instead (recomputed from the saved inputs, under the forward's autocast state), or raises
    :class:`KernelLaunchError` without a fallback."""

    @staticmethod
    def forward(ctx, op, run, fallback, *inputs):
        device = inputs[0].device.type
        ctx.op, ctx.fallback = op, fallback
        ctx.autocast = (device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device))
        with torch.enable_grad():
            ctx.inputs = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
            ctx.out = run(*ctx.inputs)
        return ctx.out.detach()

    @staticmethod
    def backward(ctx, grad):
        inputs, out = ctx.inputs, ctx.out
        ctx.out = None  # the kernels' graph is freed with their backward
        try:
            grads = torch.autograd.grad(out, [t for t in inputs if t.requires_grad], grad, allow_unused=True)
        except CANNOT_RUN as e:
            q = inputs[0]
            if ctx.fallback is None:
                raise _launch_error(ctx.op, q, e) from e
            _failed(_key(ctx.op, inputs), ctx.op, q, e)
            device, dtype, enabled = ctx.autocast
            with torch.enable_grad(), torch.autocast(device, dtype, enabled=enabled):
                inputs = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
                out = ctx.fallback(*inputs)
            grads = torch.autograd.grad(out, [t for t in inputs if t.requires_grad], grad, allow_unused=True)
        grads = iter(grads)
        return (None, None, None, *(next(grads) if t.requires_grad else None for t in inputs))


def run_or_fall_back(op: str, run: Callable[..., torch.Tensor], inputs, impl: str,
                     torch_path: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``run(*inputs)`` (the op's Triton path) if its kernels fit the inputs' GPU (:func:`kernels_fit`) and its
    launches succeed, else ``torch_path(*inputs)`` for the requested ``impl`` (:func:`fallback_for`): for a failing
    backward launch, the torch path's gradients. Without a fallback, a failing launch raises naming the op, shape,
    dtype and GPU."""
    fallback = fallback_for(impl, torch_path)
    if not kernels_fit(op, run, inputs, fallback):
        return fallback(*inputs)
    q = inputs[0]
    if not on_gpu(q) or torch.compiler.is_compiling():
        return run(*inputs)
    try:
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            return _GuardedBackward.apply(op, run, fallback, *inputs)
        return run(*inputs)
    except CANNOT_RUN as e:
        if fallback is None:
            raise _launch_error(op, q, e) from e
        _failed(_key(op, inputs), op, q, e)
        return fallback(*inputs)
