"""The one place where an op's implementation is chosen.

``impl`` is one of:

* ``'reference'`` - dense and obviously correct: forms the whole N x N mask (test oracle);
* ``'torch'`` - the fast PyTorch path: masks assembled from O(N) tables, memory-lean autograd;
* ``'triton'`` - fused GPU kernels (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``);
* ``'auto'`` - triton for CUDA tensors when a kernel exists and triton imports, torch otherwise.

The environment variable ``MMPPMA_IMPL`` (one of the above) overrides ``'auto'`` everywhere, for A/B
runs without touching configs.
"""
import os
from typing import Iterable

import torch

IMPLS = ('auto', 'torch', 'triton', 'reference')
ENV_VAR = 'MMPPMA_IMPL'


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install that fails at import
        return False
    return True


def triton_interpreted() -> bool:
    return os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')


@torch.compiler.disable
def _refuse_to_compile(message: str) -> None:
    """Raise ``message``. Run eagerly: an exception raised while dynamo traces only makes it fall back to
    eager code, where the condition is no longer visible."""
    raise RuntimeError(message)


def resolve_impl(impl: str, op: str, tensors: Iterable[torch.Tensor], triton_ops: Iterable[str] = ()) -> str:
    """Return the concrete implementation ('torch' | 'triton' | 'reference') for ``op``.

    ``triton_ops`` names the ops that have a Triton kernel.
    """
    if impl not in IMPLS:
        raise ValueError(f'impl={impl!r} is not supported; choose one of {", ".join(map(repr, IMPLS))}')
    if impl == 'auto':
        forced = os.environ.get(ENV_VAR, '').strip()
        if forced:
            if forced not in IMPLS:
                raise ValueError(f'{ENV_VAR}={forced!r} is not supported; set it to one of '
                                 f'{", ".join(IMPLS)} or unset it')
            impl = forced
    tensors = list(tensors)
    on_cuda = any(t.is_cuda for t in tensors)
    has_kernel = op in set(triton_ops)
    if impl == 'auto':
        return 'triton' if (on_cuda and has_kernel and triton_available()) else 'torch'
    if impl == 'triton':
        if not has_kernel:
            raise NotImplementedError(
                f"{op}: no Triton kernel exists for this op yet; use impl='torch' (fast PyTorch) or "
                f"impl='reference' (dense), or impl='auto'")
        if not triton_available():
            raise RuntimeError(f"{op}: impl='triton' needs the triton package (pip install triton); "
                               f"use impl='torch' or impl='auto' instead")
        if not on_cuda and not triton_interpreted():
            raise RuntimeError(f"{op}: impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                               f"triton is imported, for CPU debugging); use impl='torch' or impl='auto' "
                               f"on this device")
        if not on_cuda and torch.compiler.is_compiling():
            _refuse_to_compile(f"{op}: impl='triton' on CPU tensors runs the Triton interpreter, which "
                               f"torch.compile cannot trace; use impl='torch' (what impl='auto' picks on CPU) "
                               f"or run uncompiled")
    return impl
