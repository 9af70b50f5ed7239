"""mmengine's default optimizer wrapper constructor, with the optimizer's param groups as plain dicts.

Built from a config, mmengine's constructor hands the optimizer its param groups as ``ConfigDict``s; dynamo
cannot trace an optimizer step over such groups, so ``compile=True`` (which compiles ``train_step``, the
optimizer step included) fails. The constructors here give the optimizer plain dicts.
"""
from mmengine.config import ConfigDict
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper

from mmppma.registry import register_optim_wrapper_constructor


def _plain(value):
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def plain_param_groups(optim_wrapper: OptimWrapper) -> OptimWrapper:
    """Replace every param group of ``optim_wrapper.optimizer`` that is a dict subclass (``ConfigDict``) by a
    plain dict with the same entries. For a freshly built optimizer (no state yet)."""
    groups = optim_wrapper.optimizer.param_groups
    groups[:] = [_plain(g) if isinstance(g, ConfigDict) else g for g in groups]
    return optim_wrapper


@register_optim_wrapper_constructor
class ParamwiseOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's ``DefaultOptimWrapperConstructor`` (same ``paramwise_cfg``: ``norm_decay_mult``,
    ``custom_keys``, ...) whose optimizer holds plain-dict param groups, so that ``compile=True`` can trace its
    step. Example::

        optim_wrapper = dict(
            optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05),
            constructor='mmppma.ParamwiseOptimWrapperConstructor',
            paramwise_cfg=dict(norm_decay_mult=0.0))
    """

    def __call__(self, model) -> OptimWrapper:
        return plain_param_groups(super().__call__(model))
