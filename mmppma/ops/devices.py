"""What the ops know of the devices: a GPU's capability, memory and name, whether triton imports and runs
interpreted, the TF32 setting, and the simulated GPU.

The environment variable ``MMPPMA_SIMULATE_CUDA`` (one of :data:`TARGET_CAPABILITIES`) simulates a GPU: CPU
tensors take the CUDA code path of that capability (the implementation's choice, the preflight and its fallback,
the launch table) and the kernels run on Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is
imported). It is read whenever an op decides; :func:`on_gpu` and :func:`device_capability` are the one place that
asks. The simulated GPU's memory, which sizes the torch paths' blocks (:func:`device_memory`), is that of a common
card of the capability (:data:`SIMULATED_MEMORY_GIB`) unless ``MMPPMA_SIMULATE_CUDA_MEMORY`` gives it in GiB.
"""
import os
import sys
from typing import Optional

import torch

from .caches import register_cache

SIMULATE_VAR = 'MMPPMA_SIMULATE_CUDA'
SIMULATE_MEMORY_VAR = 'MMPPMA_SIMULATE_CUDA_MEMORY'
#: the compute capabilities (major * 10 + minor) whose launch tables ``tools/check_kernels.py`` proves (every row
#: compiles within the target's limits, on tensor cores in half precision): ``impl='auto'`` runs the kernels there
CAPABILITIES = (80, 86, 89, 90, 100, 120)
#: the capabilities that can be simulated and compiled for: the tables' and Turing (sm_75), where Triton emits no
#: tensor-core instruction and ``impl='auto'`` takes the torch path
TARGET_CAPABILITIES = (75, 80, 86, 89, 90, 100, 120)
#: the memory (GiB) of the simulated GPU of each capability unless ``MMPPMA_SIMULATE_CUDA_MEMORY`` is set: a common
#: card of it (T4, A100, RTX 3090, RTX 4090, H100, B200, RTX 5090)
SIMULATED_MEMORY_GIB = {75: 16, 80: 80, 86: 24, 89: 24, 90: 80, 100: 180, 120: 32}

# os.environ's own mapping and its keys encoded once: a read costs no Python calls, where os.environ.get costs four
# (the ops read the variables on every call)
_ENVIRON = getattr(os.environ, '_data', None)
_ENCODED = register_cache('environment_keys', 64)
_FS_ENCODING = sys.getfilesystemencoding()


def environ_values(*names: str) -> tuple:
    """The raw values of the variables ``names`` (bytes or str; None when unset), in one call: a cache key."""
    if _ENVIRON is None:
        return tuple(os.environ.get(name) for name in names)
    keys = _ENCODED.get(names)
    if keys is None:
        keys = _ENCODED[names] = tuple(os.environ.encodekey(name) for name in names)
    return tuple(map(_ENVIRON.get, keys))


def environ(name: str) -> Optional[str]:
    """``os.environ.get(name)``, cheap on the host."""
    if _ENVIRON is None:
        return os.environ.get(name)
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = os.environ.encodekey(name)
    value = _ENVIRON.get(key)
    return value.decode(_FS_ENCODING, 'surrogateescape') if isinstance(value, bytes) else value


# what torch.backends.cuda.matmul.fp32_precision reads, without the module's Python attribute lookup
_FP32_PRECISION = getattr(torch._C, '_get_fp32_precision_getter', None)


def tf32_matmul() -> bool:
    """Whether torch lets float32 CUDA matmuls use TF32: ``torch.backends.cuda.matmul.fp32_precision`` where torch
    has it (it inherits ``torch.backends.fp32_precision`` and follows the legacy flag when that was set; reading
    the legacy flag raises once the new setting was used), else ``torch.backends.cuda.matmul.allow_tf32``."""
    if _FP32_PRECISION is None:
        return bool(torch._C._get_cublas_allow_tf32())
    return _FP32_PRECISION('cuda', 'matmul') == 'tf32'


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install that fails at import
        return False
    return True


def triton_interpreted() -> bool:
    return (environ('TRITON_INTERPRET') or '0') not in ('', '0')


def simulated_capability() -> int:
    """The capability ``MMPPMA_SIMULATE_CUDA`` simulates on CPU tensors; 0 when it is unset."""
    value = environ(SIMULATE_VAR)
    if not value:
        return 0
    interpreted = environ('TRITON_INTERPRET')
    cached = _SIMULATED.get((value, interpreted))
    if cached is None:
        cached = _simulated(value.strip())
        if cached and not triton_interpreted():
            raise RuntimeError(f'{SIMULATE_VAR}={value} runs the kernels on Triton\'s interpreter: set '
                               f'TRITON_INTERPRET=1 before triton is imported, or unset {SIMULATE_VAR}')
        _SIMULATED[value, interpreted] = cached
    return cached


_SIMULATED = register_cache('simulated_capability', 16)


def _simulated(value: str) -> int:
    if not value:
        return 0
    if value not in map(str, TARGET_CAPABILITIES):
        raise ValueError(f'{SIMULATE_VAR}={value!r} is not a simulated capability; set it to one of '
                         f'{", ".join(map(str, TARGET_CAPABILITIES))} or unset it')
    return int(value)


def on_gpu(t: torch.Tensor) -> bool:
    """Whether ``t`` is on a CUDA device, or a CPU tensor on the simulated one (``MMPPMA_SIMULATE_CUDA``)."""
    return t.is_cuda or (t.device.type == 'cpu' and simulated_capability() != 0)


def device_capability(device: torch.device) -> int:
    """Compute capability (major * 10 + minor) of a CUDA device, the simulated one for the CPU under
    ``MMPPMA_SIMULATE_CUDA``; 0 otherwise (the interpreter's own launch configuration). A GPU's is read once."""
    if device.type == 'cuda':
        index = device.index if device.index is not None else torch.cuda.current_device()
        cap = _CUDA_CAPABILITIES.get(index)
        if cap is None:
            major, minor = torch.cuda.get_device_capability(index)
            cap = _CUDA_CAPABILITIES[index] = major * 10 + minor
        return cap
    return simulated_capability() if device.type == 'cpu' else 0


_CUDA_CAPABILITIES = register_cache('cuda_capabilities', 64)


def device_memory(device: torch.device) -> int:
    """Total memory in bytes of a CUDA device, of the simulated one for the CPU under ``MMPPMA_SIMULATE_CUDA``
    (:data:`SIMULATED_MEMORY_GIB`, or ``MMPPMA_SIMULATE_CUDA_MEMORY`` GiB); 0 otherwise. A GPU's is read once."""
    if device.type == 'cuda':
        index = device.index if device.index is not None else torch.cuda.current_device()
        memory = _CUDA_MEMORY.get(index)
        if memory is None:
            memory = _CUDA_MEMORY[index] = torch.cuda.get_device_properties(index).total_memory
        return memory
    cap = simulated_capability() if device.type == 'cpu' else 0
    if not cap:
        return 0
    value = environ(SIMULATE_MEMORY_VAR)
    memory = _SIMULATED_MEMORY.get((cap, value))
    if memory is None:
        memory = _SIMULATED_MEMORY[cap, value] = _simulated_memory(cap, (value or '').strip())
    return memory


_CUDA_MEMORY = register_cache('cuda_memory', 64)
_SIMULATED_MEMORY = register_cache('simulated_memory', 16)


def _simulated_memory(cap: int, value: str) -> int:
    if not value:
        return SIMULATED_MEMORY_GIB[cap] << 30
    try:
        gib = float(value)
    except ValueError:
        gib = 0.0
    if not gib > 0 or gib == float('inf'):
        raise ValueError(f'{SIMULATE_MEMORY_VAR}={value!r} is not a memory size; set it to the simulated GPU\'s '
                         f'memory in GiB (a positive number, e.g. 16 or 0.5) or unset it')
    return int(gib * (1 << 30))


def device_name(device: torch.device) -> str:
    """The GPU's name, for messages."""
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    cap = device_capability(device)
    return f'simulated sm_{cap} ({device})' if cap else str(device)
