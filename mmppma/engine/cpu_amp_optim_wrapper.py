"""Mixed-precision training on CPU: mmengine's ``AmpOptimWrapper`` asserts an accelerator, so CPU runs
(``tools/train.py --amp`` without CUDA) take this wrapper instead."""
import contextlib
import functools
import importlib
from typing import Iterator, Union

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper

from ..registry import register_optim_wrapper

#: mmcv's compiled ops (module, autograd Function) that detectors call and whose CPU kernels take float32 only
MMCV_FLOAT32_OPS = (('mmcv.ops.nms', 'NMSop'), ('mmcv.ops.roi_align', 'RoIAlignFunction'))


def _in_float32(method, forward: bool):
    """``method`` of an autograd Function, run on float32 copies of its floating-point tensor arguments outside
    autocast when the forward ran under CPU autocast; the forward's floating output is cast back to the dtype of
    its first floating input (autograd casts the backward's gradients to their inputs' dtypes)."""

    @functools.wraps(method)
    def run(ctx, *args):
        if forward:
            ctx.mmppma_float32 = torch.is_autocast_enabled('cpu')
        if not ctx.mmppma_float32:
            return method(ctx, *args)
        dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        args = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        with torch.autocast('cpu', enabled=False):
            out = method(ctx, *args)
        if forward and isinstance(out, torch.Tensor) and out.is_floating_point() and dtype is not None:
            return out.to(dtype)
        return out

    return staticmethod(run)


def run_mmcv_ops_in_float32_under_cpu_autocast() -> None:
    """Make each of :data:`MMCV_FLOAT32_OPS` that is installed run in float32 while CPU autocast is on
    (:func:`_in_float32`); no change otherwise. Idempotent."""
    for module_name, name in MMCV_FLOAT32_OPS:
        try:
            function = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):  # mmcv-lite, or a version without it: no detector on this install
            continue
        if getattr(function, 'mmppma_float32', False):
            continue
        function.forward = _in_float32(function.forward, forward=True)
        function.backward = _in_float32(function.backward, forward=False)
        function.mmppma_float32 = True


@register_optim_wrapper
class CPUAmpOptimWrapper(OptimWrapper):
    """Runs the forward and the loss under ``torch.autocast('cpu', dtype=torch.bfloat16)``; parameters, gradients
    and the optimizer step stay float32. bfloat16 has float32's exponent range, so no loss scale is needed; float16
    (which would need one) is refused. mmcv's CPU kernels that detectors call (NMS, RoIAlign) take float32 only:
    they get float32 inputs while autocast is on (:func:`run_mmcv_ops_in_float32_under_cpu_autocast`).

    Args:
        dtype: the autocast dtype, ``'bfloat16'`` (the only one).
        **kwargs: :class:`mmengine.optim.OptimWrapper`'s (``optimizer``, ``accumulative_counts``, ``clip_grad``).
    """

    def __init__(self, dtype: Union[str, torch.dtype] = 'bfloat16', **kwargs):
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(f'{type(self).__name__}: dtype={dtype!r} is not supported on CPU; use '
                             f"dtype='bfloat16' (float16 training needs a loss scale: AmpOptimWrapper on a GPU)")
        super().__init__(**kwargs)
        self.cast_dtype = torch.bfloat16
        run_mmcv_ops_in_float32_under_cpu_autocast()

    @contextlib.contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield
