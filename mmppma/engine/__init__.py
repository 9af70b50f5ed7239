"""Training-side helpers: optimizer wrapper constructors and the CPU mixed-precision wrapper (registered for every
OpenMMLab library)."""
from .cpu_amp_optim_wrapper import CPUAmpOptimWrapper
from .layer_decay_optim_wrapper_constructor import LayerDecayOptimWrapperConstructor
from .paramwise_optim_wrapper_constructor import ParamwiseOptimWrapperConstructor, plain_param_groups

__all__ = ['CPUAmpOptimWrapper', 'LayerDecayOptimWrapperConstructor', 'ParamwiseOptimWrapperConstructor',
           'plain_param_groups']
