"""The preflight of the Triton paths: before an ``impl='auto'`` op first launches its kernels for an input
signature on a GPU, they are compiled and loaded once (on ``meta`` tensors, recorded by
:func:`mmppma.ops.triton_support.launch.recording`); where one cannot run there, the op falls back to its torch
path with one warning. ``impl='triton'`` raises what the launch raises instead.
"""
import contextlib
import os
import warnings
from typing import Callable, Dict, Optional

import torch

from ..dispatch import ENV_VAR

_PREFLIGHT: Dict[tuple, Optional[Exception]] = {}


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == 'cuda' else str(device)


def fallback_for(impl: str, torch_path: Callable[[], torch.Tensor]) -> Optional[Callable[[], torch.Tensor]]:
    """The torch path to fall back on when a kernel cannot compile or launch on the user's GPU: only for
    ``impl='auto'`` (not forced to triton through the environment); ``impl='triton'`` raises instead."""
    return torch_path if impl == 'auto' and not os.environ.get(ENV_VAR, '').strip() else None


def kernels_fit(op: str, run: Callable[[], torch.Tensor], inputs, fallback) -> bool:
    """Whether every kernel launch of ``run`` (forward and backward) compiles and loads on the inputs' GPU, found
    once per (op, shapes, dtypes, device) by running the op on ``meta`` tensors and compiling what it records.
    With no ``fallback`` (or no GPU) this is not asked: the launches raise themselves."""
    q = inputs[0]
    if fallback is None or not _on_gpu(q) or torch.compiler.is_compiling():
        # while compiling, the shapes may be symbolic: the kernels run unchecked and raise what a launch raises
        return True
    key = (op, q.device, *((tuple(t.shape), t.dtype) for t in inputs))
    if key not in _PREFLIGHT:
        from triton.runtime.errors import TritonError

        from . import launch
        meta = [t.detach().to('meta').requires_grad_(t.is_floating_point()) for t in inputs]
        error = None
        try:
            with launch.recording(launch.capability(q.device)) as launches:
                out = run(*meta)
                torch.autograd.grad(out, [t for t in meta if t.requires_grad], torch.empty_like(out),
                                    allow_unused=True)
            with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
                for item in launches:
                    item.prepare()
        except TritonError as e:  # OutOfResources, CompilationError, PTXASError
            error = e
        _PREFLIGHT[key] = error
        if error is not None:
            warnings.warn(f"{op}: the Triton kernels cannot run on {_device_name(q.device)} for "
                          f"inputs {tuple(q.shape)} {q.dtype} ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); impl='auto' falls back to "
                          f"impl='torch' for these inputs")
    return _PREFLIGHT[key] is None


def run_or_fall_back(op: str, run: Callable[..., torch.Tensor], inputs, impl: str,
                     torch_path: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``run(*inputs)`` (the op's Triton path) if its kernels fit the inputs' GPU (:func:`kernels_fit`), else the
    fallback of the requested ``impl`` (:func:`fallback_for`)."""
    fallback = fallback_for(impl, torch_path)
    if not kernels_fit(op, run, inputs, fallback):
        return fallback()
    return run(*inputs)
