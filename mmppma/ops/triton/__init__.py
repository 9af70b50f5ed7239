"""Triton kernels (GPU; CPU under ``TRITON_INTERPRET=1``), each with its autograd wrapper beside it.

Importing this package imports triton; :mod:`mmppma.ops` does so only when ``impl`` resolves to
``'triton'``, so everything else works where triton is missing.

The kernels run inside ``torch.library`` ops (``mmppma::whole_attention_triton``, ``line_attention_triton``,
``decay_scan_triton`` and their backwards, registered in the modules beside them): ``torch.compile`` traces the
entry points below without a graph break and sees each kernel call as one node.
"""
import contextlib
import os
import warnings
from typing import Callable, Dict, Optional

import torch

from ..dispatch import ENV_VAR
from ..polyline_mask import decay_tables

_PREFLIGHT: Dict[tuple, Optional[Exception]] = {}


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == 'cuda' else str(device)


def fallback_for(impl: str, torch_path: Callable[[], torch.Tensor]) -> Optional[Callable[[], torch.Tensor]]:
    """The torch path to fall back on when a kernel cannot compile or launch on the user's GPU: only for
    ``impl='auto'`` (not forced to triton through the environment); ``impl='triton'`` raises instead."""
    return torch_path if impl == 'auto' and not os.environ.get(ENV_VAR, '').strip() else None


def _kernels_fit(op: str, run: Callable[[], torch.Tensor], inputs, fallback) -> bool:
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


def _check_form(form: str) -> tuple:
    if form == 'paper':
        raise NotImplementedError("impl='triton' implements the softmax-biased forms ('release', 'v2h', "
                                  "'h2v'); for form='paper' use impl='torch'")
    return form in ('release', 'v2h'), form in ('release', 'h2v')


def ppma_attention_triton(q, k, v, la, lb, scale: float = 1.0, form: str = 'release', fallback=None):
    """``fallback``: see :func:`fallback_for` (likewise for the other entry points)."""
    from .whole_attention import whole_attention_triton
    v2h, h2v = _check_form(form)

    def run(q, k, v, la, lb):
        ca, cb = decay_tables(la, lb)
        return whole_attention_triton(q, k, v, ca, cb, scale, v2h, h2v)

    if not _kernels_fit('ppma_attention', run, (q, k, v, la, lb), fallback):
        return fallback()
    return run(q, k, v, la, lb)


def _constant_decay_tables(log_decay: torch.Tensor, q: torch.Tensor):
    """Decay tables (Ca, Cb) of RMT's fixed per-head decay, (heads,) or (B, heads), on q's (B, heads, H, W) grid."""
    b, heads, h, w, _ = q.shape
    g = log_decay.float()
    g = (g if g.dim() == 2 else g.unsqueeze(0))[:, :, None, None].expand(b, heads, h, w)
    return decay_tables(g, g)


def manhattan_attention_triton(q, k, v, log_decay, scale: float = 1.0, fallback=None):
    """RMT's Manhattan decay is the V2H polyline mask with constant decays."""
    from .whole_attention import whole_attention_triton

    def run(q, k, v, log_decay):
        ca, cb = _constant_decay_tables(log_decay, q)
        return whole_attention_triton(q, k, v, ca, cb, scale, True, False)

    if not _kernels_fit('manhattan_attention', run, (q, k, v, log_decay), fallback):
        return fallback()
    return run(q, k, v, log_decay)


def criss_cross_attention_triton(q, k, v, la, lb, scale: float = 1.0, order: str = 'both', fallback=None):
    from .line_attention import criss_cross_attention_triton as lines

    def run(q, k, v, la, lb):
        ca, cb = decay_tables(la, lb)
        return lines(q, k, v, ca, cb, scale, order)

    if not _kernels_fit('criss_cross_attention', run, (q, k, v, la, lb), fallback):
        return fallback()
    return run(q, k, v, la, lb)


def rmt_criss_cross_attention_triton(q, k, v, log_decay, scale: float = 1.0, fallback=None):
    from .line_attention import criss_cross_attention_triton as lines

    def run(q, k, v, log_decay):
        ca, cb = _constant_decay_tables(log_decay, q)
        return lines(q, k, v, ca, cb, scale, 'row_col')

    if not _kernels_fit('rmt_criss_cross_attention', run, (q, k, v, log_decay), fallback):
        return fallback()
    return run(q, k, v, log_decay)
