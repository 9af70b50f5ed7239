"""Adaptive pooling to a fixed grid, written with the bin edges computed from the input's size at run time.

``torch.onnx`` translates ``nn.AdaptiveAvgPool2d(s)`` / ``AdaptiveMaxPool2d(s)`` (s != 1, e.g. UPerNet's pyramid
pooling to 2 x 2, 3 x 3, 6 x 6) with gather indices of the traced input size, so an exported file is wrong at
any other height and width. :func:`adaptive_pool2d` gives the same result from plain ops whose sizes come from
the input tensor (``arange`` over the input's rows and columns, comparisons with the bins' edges, a matmul or
a masked max), so an export holds at every size. The pooling is separable: a bin is a rectangle, the product
of a row interval and a column interval, so the rows are pooled first, then the columns.

:class:`AdaptiveAvgPool2d` and :class:`AdaptiveMaxPool2d` take this form while a model is exported
(:func:`mmppma.ops.exporting`) and torch's own pooling otherwise; :func:`runtime_pools` puts them in place of
torch's pools for the export only (:func:`mmppma.deploy.export_onnx`).
"""
import contextlib
from typing import Iterator, List

import torch
import torch.nn as nn
from torch.nn.modules.utils import _pair

from mmppma.ops import exporting


def bin_masks(size, bins: int, device=None) -> torch.Tensor:
    """(bins, size) bool: row i marks the positions ``floor(i*size/bins) <= p < ceil((i+1)*size/bins)`` of
    bin i, torch's adaptive-pooling bins (they overlap where ``size`` is not a multiple of ``bins``, and each
    holds at least one position when ``bins > size``). ``size`` may be symbolic (a traced input size)."""
    i = torch.arange(bins, device=device)
    start = torch.div(i * size, bins, rounding_mode='floor')
    end = torch.div((i + 1) * size + bins - 1, bins, rounding_mode='floor')
    p = torch.arange(size, device=device)
    return (p >= start[:, None]) & (p < end[:, None])


def adaptive_pool2d(x: torch.Tensor, output_size, mode: str = 'avg') -> torch.Tensor:
    """``F.adaptive_avg_pool2d`` (``mode='avg'``) or ``F.adaptive_max_pool2d`` (``'max'``, values only) of
    x (..., H, W) to ``output_size`` (an int or (h, w); None keeps that axis), with the bins taken from x's
    size at run time. Sums are a matmul with the bins' weights, so they differ from torch's by rounding."""
    height, width = x.shape[-2:]
    out_h, out_w = (o if o is not None else s for o, s in zip(_pair(output_size), (height, width)))
    rows, cols = bin_masks(height, out_h, x.device), bin_masks(width, out_w, x.device)  # (h, H), (w, W)
    if mode == 'avg':
        rows = rows.to(x.dtype) / rows.sum(-1, keepdim=True).to(x.dtype)
        cols = cols.to(x.dtype) / cols.sum(-1, keepdim=True).to(x.dtype)
        return rows @ x @ cols.transpose(0, 1)  # (h, H) @ (..., H, W) @ (W, w)
    if mode == 'max':
        low = torch.finfo(x.dtype).min if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
        by_rows = torch.where(rows[:, :, None], x.unsqueeze(-3), low).amax(-2)  # (..., h, H, W) -> (..., h, W)
        return torch.where(cols, by_rows.unsqueeze(-2), low).amax(-1)  # (..., h, w, W) -> (..., h, w)
    raise ValueError(f"adaptive_pool2d: mode must be 'avg' or 'max'; got {mode!r}")


class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` whose export form (:func:`mmppma.ops.exporting`) holds at any input size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return adaptive_pool2d(x, self.output_size, 'avg') if exporting() else super().forward(x)


class AdaptiveMaxPool2d(nn.AdaptiveMaxPool2d):
    """``nn.AdaptiveMaxPool2d`` (without ``return_indices``) whose export form holds at any input size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return adaptive_pool2d(x, self.output_size, 'max') if exporting() else super().forward(x)


#: torch's pool -> its form with run-time bins
RUNTIME_FORMS = {nn.AdaptiveAvgPool2d: AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d: AdaptiveMaxPool2d}


def runtime_form(pool: nn.Module) -> nn.Module:
    """The :data:`RUNTIME_FORMS` module of a torch adaptive pool, same settings (no parameters or buffers)."""
    if isinstance(pool, nn.AdaptiveMaxPool2d) and pool.return_indices:
        raise ValueError('AdaptiveMaxPool2d(return_indices=True) has no run-time export form here')
    form = RUNTIME_FORMS[type(pool)](pool.output_size)
    return form.train(pool.training)


def fixed_grid_pools(module: nn.Module) -> List[str]:
    """Names of the submodules that pool to a fixed grid other than 1 x 1 (``nn.AdaptiveAvgPool2d`` /
    ``AdaptiveMaxPool2d``, as UPerNet's pyramid pooling): torch.onnx translates them with gather indices of the
    traced input size, wrong at any other size, so the export takes their run-time form (:func:`runtime_pools`)."""
    pools = tuple(RUNTIME_FORMS)
    return [name for name, m in module.named_modules()
            if type(m) in pools and _pair(m.output_size) != (1, 1)]


@contextlib.contextmanager
def runtime_pools(module: nn.Module) -> Iterator[List[str]]:
    """Inside: the :func:`fixed_grid_pools` of ``module`` replaced by their forms with run-time bins (the same
    pooling in eager mode, and an export that holds at any input size); the originals are put back on exit.
    Yields the names replaced."""
    names = fixed_grid_pools(module)
    swapped = []
    try:
        for name in names:
            parent_name, _, child = name.rpartition('.')
            parent = module.get_submodule(parent_name)
            original = parent._modules[child]
            parent._modules[child] = runtime_form(original)
            swapped.append((parent, child, original))
        yield names
    finally:
        for parent, child, original in swapped:
            parent._modules[child] = original
