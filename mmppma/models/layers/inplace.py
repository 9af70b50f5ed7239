"""In-place shortcuts of the layers' inference: without autograd, elementwise results go into a fresh
tensor's storage (no allocation, one pass less over memory). With autograd the ops stay out of place: an
in-place op on a view costs the backward a full-size copy (``CopySlices``)."""
import torch


def records_grad(t: torch.Tensor) -> bool:
    """Whether autograd records ops on ``t``."""
    return torch.is_grad_enabled() and t.requires_grad


def add_into(fresh: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``fresh + other``, written into ``fresh`` (a tensor nothing else reads) when autograd is not recording
    and both have the same dtype and shape."""
    if ((torch.is_grad_enabled() and (fresh.requires_grad or other.requires_grad)) or fresh.dtype != other.dtype
            or fresh.shape != other.shape):
        return fresh + other
    return fresh.add_(other)
