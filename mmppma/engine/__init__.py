"""Training-side helpers: optimizer wrapper constructors (registered for every OpenMMLab library)."""
from .layer_decay_optim_wrapper_constructor import LayerDecayOptimWrapperConstructor
from .paramwise_optim_wrapper_constructor import ParamwiseOptimWrapperConstructor, plain_param_groups

__all__ = ['LayerDecayOptimWrapperConstructor', 'ParamwiseOptimWrapperConstructor', 'plain_param_groups']
