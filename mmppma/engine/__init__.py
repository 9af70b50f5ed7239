"""Training-side helpers: optimizer wrapper constructors (registered for every OpenMMLab library)."""
from .layer_decay_optim_wrapper_constructor import LayerDecayOptimWrapperConstructor

__all__ = ['LayerDecayOptimWrapperConstructor']
