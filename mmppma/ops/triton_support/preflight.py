"""The preflight of the Triton paths, on which the one rule of their torch fallback rests: ``impl='auto'`` falls back
only for what is found before any kernel runs (:func:`mmppma.ops.plan.build` asks). Once per input signature on a
(simulated) GPU, an op's launches are recorded on ``meta`` tensors (:func:`mmppma.ops.triton_support.launch.recording`),
their grids checked against CUDA's limits, and each kernel compiled and loaded. What keeps them from running
(:data:`CANNOT_RUN`) makes the op take its torch path with one warning naming the op, the shape, the dtype and the GPU.
Everything raised while the kernels run, forward or backward, is an error (:mod:`.calls`); nothing learnt at run time
is remembered. ``impl='triton'`` (or ``MMPPMA_IMPL=triton``) has no fallback and no preflight: a kernel that cannot
run raises :class:`~mmppma.ops.triton_support.calls.KernelLaunchError` when it launches.
"""
import warnings
from typing import Callable, Sequence

import torch
from triton.runtime.errors import TritonError

from ..caches import register_cache
from ..devices import device_capability
from . import launch
from .calls import Caller, first_line, raise_named

#: what the preflight finds that keeps the kernels from running on the user's GPU: a compile or resource error
#: (``TritonError``: out of shared memory, a ``CompilationError``, ptxas), a grid over CUDA's limits, a binary the
#: driver cannot load (a driver too old for the PTX)
CANNOT_RUN = (TritonError, launch.LaunchLimitError, launch.KernelLoadError)

#: (op, device, capability, shapes and dtypes) -> None (the kernels run) or what the preflight found
_VERDICTS = register_cache('preflight', 1024)


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


def kernels_fit(op: str, run: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor]) -> bool:
    """Whether every kernel launch of ``run`` (the Triton path of ``op``) can run on the GPU of ``inputs``
    (:func:`check_launches`), found once per (op, shapes, dtypes, device); if not, the one warning. What the
    preflight raises that is not :data:`CANNOT_RUN` raises, named for the op."""
    q = inputs[0]
    key = (op, q.device, device_capability(q.device), *((tuple(t.shape), t.dtype) for t in inputs))
    if key not in _VERDICTS:
        caller = Caller.of(op, q)
        try:
            check_launches(run, inputs, q.device)
            _VERDICTS[key] = None
        except CANNOT_RUN as e:
            _VERDICTS[key] = e
            warnings.warn(f"{caller.describe()} cannot run ({first_line(e)}); impl='auto' falls back to "
                          f"impl='torch' for these inputs")
        except Exception as e:
            raise_named(caller, 'in the preflight, before any kernel ran', e)
    return _VERDICTS[key] is None
