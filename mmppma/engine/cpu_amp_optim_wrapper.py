"""Mixed-precision training on CPU: mmengine's ``AmpOptimWrapper`` asserts an accelerator, so CPU runs
(``tools/train.py --amp`` without CUDA) take this wrapper instead."""
import contextlib
from typing import Iterator, Union

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper

from ..registry import register_optim_wrapper


@register_optim_wrapper
class CPUAmpOptimWrapper(OptimWrapper):
    """Runs the forward and the loss under ``torch.autocast('cpu', dtype=torch.bfloat16)``; parameters, gradients
    and the optimizer step stay float32. bfloat16 has float32's exponent range, so no loss scale is needed; float16
    (which would need one) is refused.

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

    @contextlib.contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield
