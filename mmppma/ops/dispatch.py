"""The one place where an op's implementation is chosen, and the table of which op has which.

An op is called with ``impl``, the *requested* implementation, one of the four below; :func:`resolve_impl` turns it
into the *resolved* one, which the op runs: 'torch', 'triton' or 'reference', never 'auto'. In the code the two
carry these two names, ``requested`` and ``resolved``, past the ops' signatures (:mod:`mmppma.ops.plan`).
``impl`` is one of:

* ``'reference'`` - dense and obviously correct: forms the whole N x N mask (test oracle);
* ``'torch'`` - PyTorch: masks assembled from segment-sum tables, never an N x N mask for the scans and
  criss-cross attention; whole attention's size-chosen branches are named by
  :func:`mmppma.ops.whole_attention_branch`;
* ``'triton'`` - fused GPU kernels (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``; ``meta`` tensors
  describe the launches without running them);
* ``'auto'`` - triton for CUDA tensors when a kernel exists, triton imports and the GPU's capability has a launch
  table (:data:`CAPABILITIES`; one warning per other capability), torch otherwise.

The environment variable ``MMPPMA_IMPL`` (one of the above) overrides ``'auto'`` everywhere, for A/B
runs without touching configs.

The environment variable ``MMPPMA_SIMULATE_CUDA`` (one of :data:`TARGET_CAPABILITIES`) simulates a GPU: CPU
tensors take the CUDA code path of that capability (``resolve_impl``, the preflight and its fallback, the launch
table) and the kernels run on Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is imported). It is
read whenever an op decides; :func:`on_gpu` and :func:`device_capability` are the one place that asks. The
simulated GPU's memory, which sizes the torch paths' blocks (:func:`device_memory`), is that of a common card of
the capability (:data:`SIMULATED_MEMORY_GIB`) unless ``MMPPMA_SIMULATE_CUDA_MEMORY`` gives it in GiB.

While a model is exported (:func:`exporting`: inside :func:`export_mode`, or while ``torch.export`` traces, as
``torch.onnx.export(..., dynamo=True)`` does) every op and layer runs plain PyTorch that an exporter can
translate: ``'auto'`` and ``'triton'`` resolve to ``'torch'`` (a Triton kernel is opaque to a graph), and the
torch paths take their export branches: no ``torch.library`` op, custom autograd Function, in-place inference
shortcut or Python loop over blocks of the input; the softmax attentions loop over image rows and columns as
scans (:func:`~mmppma.ops.torch_support.scan_slices`) on large or dynamic maps, which the exporter keeps as
ONNX ``Scan``s.
"""
import contextlib
import os
import sys
import warnings
from typing import Dict, Iterable, Iterator, Optional, Tuple

import torch

from .caches import register_cache
from .export_target import ExportTarget
from .forms import CRISS_CROSS_FORMS, MASK_FORMS, WHOLE_FORMS

IMPLS = ('auto', 'torch', 'triton', 'reference')
ENV_VAR = 'MMPPMA_IMPL'
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


_ALL = ('reference', 'torch', 'triton')
_NO_KERNEL = ('reference', 'torch')
# a plain global, not a ContextVar: dynamo reads (and guards on) a global, but cannot trace ContextVar.get
_EXPORT_TARGET: Optional[ExportTarget] = None  # inside export_mode: its target
_PLAIN_TARGET = ExportTarget('plain')  # no runtime's choices: the ops loop only in a dynamic export
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


@contextlib.contextmanager
def export_mode(target: Optional[ExportTarget] = None) -> Iterator[None]:
    """Run mmppma's ops and layers as plain PyTorch inside this context (see the module docstring), their export
    forms chosen for ``target`` (:class:`~mmppma.ops.export_target.ExportTarget`; None: no runtime's choices, the
    ops loop only in a dynamic export); for exporters, and for checking the export paths in eager mode."""
    global _EXPORT_TARGET
    if target is not None and not isinstance(target, ExportTarget):
        raise TypeError(f'export_mode: target must be an ExportTarget (mmppma.deploy.targets) or None; got {target!r}')
    before, _EXPORT_TARGET = _EXPORT_TARGET, target or _PLAIN_TARGET
    try:
        yield
    finally:
        _EXPORT_TARGET = before


def exporting() -> bool:
    """Whether the ops and layers take their plain PyTorch paths: inside :func:`export_mode`, or while
    ``torch.export`` traces."""
    return _EXPORT_TARGET is not None or torch.compiler.is_exporting()


def export_target() -> ExportTarget:
    """The target of the export in progress (:func:`export_mode`'s; a ``torch.export`` trace outside it: none of
    a runtime's choices)."""
    return _EXPORT_TARGET or _PLAIN_TARGET


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
