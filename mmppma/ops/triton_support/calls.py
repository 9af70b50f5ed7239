"""A Triton path's call and its failures' names. Eager calls run the kernels as one autograd node
(:class:`KernelFunction`) or, without autograd, the forward alone; while torch.compile traces, the ``torch.library``
op (:func:`call_kernels`). Everything raised while the kernels run, forward or backward, is an error: an
out-of-memory or CUDA error as it is, anything else as :class:`KernelLaunchError` naming the public op, its first
input's shape and dtype and the GPU (a :class:`Caller`, made once per plan by the op's Triton path builder).
"""
from typing import Callable, NamedTuple, Optional, Tuple

import torch

from ..devices import device_name, simulated_capability
from .launch import is_recording


class KernelLaunchError(RuntimeError):
    """A failure of a Triton path (other than an out-of-memory or CUDA error), naming the op, shape, dtype and
    GPU; or, under ``impl='triton'``, kernels that cannot run on the inputs' GPU."""


class Caller(NamedTuple):
    """What a Triton path's failures name: the public op and its first input's shape, dtype and device."""
    op: str
    shape: Tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, op: str, t: torch.Tensor) -> 'Caller':
        return cls(op, tuple(t.shape), t.dtype, t.device)

    def describe(self) -> str:
        return f'{self.op}: the Triton kernels on {device_name(self.device)} for inputs {self.shape} {self.dtype}'


def is_device_error(error: BaseException) -> bool:
    """Whether ``error`` is the device's own (out of memory, or a CUDA error, which may have been left by an
    earlier kernel): it propagates as it is, never blamed on an op."""
    if isinstance(error, (torch.OutOfMemoryError, torch.AcceleratorError)):
        return True
    return isinstance(error, RuntimeError) and str(error).startswith('Triton Error [CUDA]')  # triton's launcher


def first_line(error: Exception) -> str:
    return f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'


def kernel_failure(caller: Caller, where: str, error: Exception) -> Exception:
    """What a failure ``error`` of the Triton path of ``caller`` raises: on a (simulated) GPU a
    :class:`KernelLaunchError` naming the op, the shape, the dtype, the GPU and ``where`` it happened; an
    out-of-memory or CUDA error, any error on the interpreter, or one while the launches are recorded (the
    preflight's, which names what it finds itself), as it is."""
    device = caller.device
    if (is_device_error(error) or is_recording()
            or not (device.type == 'cuda' or (device.type == 'cpu' and simulated_capability()))):
        return error
    if isinstance(error, KernelLaunchError):  # raised by an op this one is made of
        return KernelLaunchError(f'{caller.describe()}: in {error}')
    return KernelLaunchError(f"{caller.describe()} failed {where}: {first_line(error)}; impl='torch' runs the torch "
                             f"path")


def raise_named(caller: Caller, where: str, error: Exception) -> None:
    """Raise :func:`kernel_failure`'s error for ``error`` (from ``error`` when it is another)."""
    named = kernel_failure(caller, where, error)
    if named is error:
        raise error
    raise named from error


class KernelFunction(torch.autograd.Function):
    """A Triton path's forward and backward as one autograd node, for eager calls (no library op's dispatch):
    ``KernelFunction.apply((forward, backward, count), caller, *inputs)``. The first ``count`` inputs are tensors,
    the rest plain arguments. ``forward(*inputs)`` returns (output, *extra) and the node saves the tensors and the
    extra; ``backward(grad, *tensors, *extra, *arguments)`` returns the tensors' gradients. A missing output
    gradient is no work; failures raise as :func:`raise_named` names them, for the public op of ``caller``."""

    @staticmethod
    def forward(ctx, kernels, caller, *inputs):
        forward, _, count = kernels
        ctx.set_materialize_grads(False)
        try:
            out, *extra = forward(*inputs)
        except Exception as e:
            raise_named(caller, 'while running', e)
        ctx.save_for_backward(*inputs[:count], *extra)
        ctx.kernels, ctx.caller, ctx.arguments = kernels, caller, inputs[count:]
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
            raise_named(ctx.caller, 'in the backward', e)
        return (None, None, *grads, *nothing)


def call_kernels(caller: Caller, library_op: Optional[Callable], kernels: tuple, infer: Callable,
                 traced: Optional[bool], *inputs):
    """A Triton path's output for ``inputs`` (tensors first, ``kernels[2]`` of them, then plain arguments): the
    ``torch.library`` op while torch.compile traces (``traced``; None: ask), the :class:`KernelFunction` node
    ``kernels`` while autograd records on an input tensor, else ``infer(*inputs)[0]`` (the forward's outputs, nothing
    saved), failures named for ``caller``."""
    if torch.compiler.is_compiling() if traced is None else traced:
        return library_op(*inputs)[0]
    if torch.is_grad_enabled():
        for t in inputs[:kernels[2]]:
            if t.requires_grad:
                return KernelFunction.apply(kernels, caller, *inputs)
    try:
        return infer(*inputs)[0]
    except Exception as e:
        raise_named(caller, 'while running', e)
