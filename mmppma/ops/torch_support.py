"""Helpers shared by the torch paths of the softmax attentions: when to take the inference branches, how many
score elements a block holds, the in-place softmax and its backward, the CPU-friendly padding of softmax rows, and
the slice-by-slice loop of the exported forms."""
from typing import Callable

import torch

from .devices import device_memory
from .export import export_target, exporting

#: on a GPU, one score tensor of a torch path may take this share of the device's memory (a call holds a few at
#: once, and autograd keeps the probabilities of every layer until the backward)
GPU_SCORE_SHARE = 1 / 64


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd records ops on these tensors; without it the ops take their inference paths (no saved
    tensors, in-place softmax)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def eager_inference(*tensors: torch.Tensor) -> bool:
    """Whether the criss-cross ops take their inference loop over groups of (image, head) maps: autograd not
    recording, and neither torch.compile tracing (a Python loop over the batch would specialise the graph on
    its size) nor an export (:func:`mmppma.ops.export.exporting`)."""
    return not needs_grad(*tensors) and not torch.compiler.is_compiling() and not exporting()


def score_elements(device: torch.device, cpu_elements: int) -> int:
    """How many float32 score elements one block of a torch path may hold on ``device``: on a GPU (or the
    simulated one) :data:`GPU_SCORE_SHARE` of its memory (:func:`~mmppma.ops.devices.device_memory`, read once
    per device), elsewhere ``cpu_elements`` (sized for a CPU's caches)."""
    memory = device_memory(device)
    return int(memory * GPU_SCORE_SHARE) // 4 if memory else cpu_elements


def flatten(t: torch.Tensor) -> torch.Tensor:
    """(B, heads, H, W, d) -> (B, heads, N, d), raster order."""
    b, h, hh, ww, d = t.shape
    return t.reshape(b, h, hh * ww, d)


def softmax_(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim into ``x`` (CPU: the kernel overwrites each row in place; elsewhere through
    a temporary)."""
    if x.device.type == 'cpu':
        return torch.ops.aten._softmax.out(x, -1, False, out=x)
    return x.copy_(x.softmax(-1))


def softmax_backward_(grad: torch.Tensor, probs: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
    """``probs * (grad - rowsum(probs * grad))`` (the softmax backward), into ``out`` if given, else into
    ``probs``'s storage on CPU."""
    if out is not None:
        return torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=out)
    if probs.device.type == 'cpu':
        return torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=probs)
    return torch._softmax_backward_data(grad, probs, -1, probs.dtype)


def padded(n: int, device: torch.device) -> int:
    """Softmax row length for n scores on the inference paths: CPU softmax kernels run up to several times
    faster on rows a multiple of 16 long (the padding holds -inf, so the probabilities do not change)."""
    return -(-n // 16) * 16 if device.type == 'cpu' else n


def pad_last(t: torch.Tensor, length: int, value: float) -> torch.Tensor:
    """``t`` with its last dim extended to ``length`` by ``value``."""
    if t.shape[-1] == length:
        return t
    return torch.cat([t, t.new_full((*t.shape[:-1], length - t.shape[-1]), value)], -1)


def export_loops(op: str, tokens) -> bool:
    """Whether ``op``'s export form (``'whole'``, ``'criss_cross'``) loops over slices (:func:`scan_slices`) for
    maps of ``tokens``, as the export's target decides (:func:`~mmppma.ops.export.export_target`): always in a
    dynamic export (``tokens`` a traced size: the file serves every size, and loops win on large maps), in a
    fixed-size one above the target's threshold for ``op``."""
    return export_target().loops(op, tokens)


def scan_slices(body: Callable[..., torch.Tensor], *xs: torch.Tensor) -> torch.Tensor:
    """``body`` of the i-th slices (along dim 0) of the tensors ``xs``, for every i, stacked along a new dim 0: the
    exported forms' loop over slices, so that each slice's maps stay in cache. While ``torch.export`` traces it is
    one ``torch.scan`` (an ONNX ``Scan`` with a dynamic trip count); in eager mode a Python loop computes the same.

    Under ``torch.export``, ``body`` may close over tensors (none a view of another operand: ``xs`` are copied
    here) but not over sizes: a traced size is a symbol the scan's body cannot take, so ``body`` reads the sizes it
    needs from the shapes of its own operands."""
    if not torch.compiler.is_exporting():
        return torch.stack([body(*(x[i] for x in xs)) for i in range(xs[0].shape[0])])
    from torch._higher_order_ops.scan import scan

    def step(carry, slices):  # no carry: scan needs one, and one that is not an operand (no aliasing)
        return carry.clone(), body(*slices)

    _, out = scan(step, xs[0].new_zeros(()), tuple(x.clone(memory_format=torch.contiguous_format) for x in xs))
    return out
