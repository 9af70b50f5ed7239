"""mmppma's registries: children of mmengine's root registries, scope ``mmppma``.

A class registered with :func:`register_model` is buildable

* as ``type='mmppma.X'`` from any OpenMMLab 2.0 config (mmdet, mmseg, mmpretrain, ...), with no
  ``custom_imports``: mmengine imports ``mmppma.registry`` for the scope and then the ``locations``;
* as a bare ``type='X'`` once mmppma is imported, from any scope: the class is also put into mmengine's
  root registry, the common parent of every downstream library's registry. A name that the root already
  holds raises at registration (``KeyError``), so mmppma never shadows upstream classes.
"""
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import Registry

__all__ = ['MODELS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'OPTIM_WRAPPERS', 'register_model',
           'register_optim_wrapper_constructor', 'register_optim_wrapper']

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmppma', locations=['mmppma.models'])
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    'optimizer wrapper constructor',
    parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS,
    scope='mmppma',
    locations=['mmppma.engine'])
OPTIM_WRAPPERS = Registry('optim wrapper', parent=MMENGINE_OPTIM_WRAPPERS, scope='mmppma', locations=['mmppma.engine'])


def _register_twice(child: Registry, root: Registry):

    def decorator(cls):
        # the root first: a name it already holds raises before the child has seen the class
        root.register_module(module=cls)
        child.register_module(module=cls)
        return cls

    return decorator


def register_model(cls):
    """Register ``cls`` as ``mmppma.<name>`` and as the bare ``<name>`` (see module docstring)."""
    return _register_twice(MODELS, MMENGINE_MODELS)(cls)


def register_optim_wrapper_constructor(cls):
    """Like :func:`register_model`, for optimizer wrapper constructors."""
    return _register_twice(OPTIM_WRAPPER_CONSTRUCTORS, MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS)(cls)


def register_optim_wrapper(cls):
    """Like :func:`register_model`, for optimizer wrappers."""
    return _register_twice(OPTIM_WRAPPERS, MMENGINE_OPTIM_WRAPPERS)(cls)
