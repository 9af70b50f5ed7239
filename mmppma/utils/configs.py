"""The model an OpenMMLab 2.0 config describes, built with its library's registry: one helper for the tools and the
checkpoint converters. The library the config's ``default_scope`` names is imported and registered only when a
config is built; mmppma's own modules are registered already (importing this module initializes the mmppma package
first)."""
import copy
import importlib
from typing import Optional, Union

import torch

__all__ = ['register_scope_modules', 'load_config', 'build_config_model']

# default_scope -> the package that owns it (the scope and package names differ only for mmseg).
_SCOPE_PACKAGES = {'mmdet': 'mmdet', 'mmseg': 'mmseg', 'mmpretrain': 'mmpretrain', 'mmdet3d': 'mmdet3d'}
_PIP_NAMES = {'mmseg': 'mmsegmentation'}


def register_scope_modules(default_scope: Optional[str]) -> None:
    """Register the modules of the library named by ``default_scope`` (mmppma's are registered on import).

    ``None`` or ``'mmengine'`` registers nothing beyond mmppma. A library without
    ``utils.register_all_modules`` is imported as a plain package (its registries' ``locations`` do
    the rest).
    """
    if default_scope in (None, 'mmengine', 'mmppma'):
        return
    package = _SCOPE_PACKAGES.get(default_scope, default_scope)
    try:
        importlib.import_module(package)
    except ImportError as err:
        pip_name = _PIP_NAMES.get(package, package)
        raise ImportError(f"the config's default_scope='{default_scope}' needs the package '{package}', "
                          f'which failed to import ({err}). Install it (pip install {pip_name}, '
                          'or run bash tools/setup_env.sh) or fix default_scope in the config.') from err
    try:
        utils = importlib.import_module(f'{package}.utils')
    except ModuleNotFoundError as err:
        if err.name != f'{package}.utils':
            raise  # a real missing dependency, not a library without a utils module
        return
    register = getattr(utils, 'register_all_modules', None)
    if register is not None:
        register(init_default_scope=False)


def load_config(config, cfg_options: Optional[dict] = None):
    """An mmengine ``Config`` from a file (or a ``Config``, copied), with ``cfg_options`` merged."""
    from mmengine.config import Config
    cfg = copy.deepcopy(config) if isinstance(config, Config) else Config.fromfile(str(config))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def build_config_model(config, *, backbone_only: bool = False, backbone_overrides: Optional[dict] = None,
                       cfg_options: Optional[dict] = None,
                       device: Union[str, torch.device] = 'cpu') -> torch.nn.Module:
    """The config's model (or only its backbone), built with the registry of its ``default_scope`` on ``device``
    ('meta': shapes only, no memory), without initializing weights (``init_cfg`` is not applied).

    ``config``: a file (``str`` or ``Path``) or an mmengine ``Config``; ``cfg_options``: merged first, as
    ``--cfg-options``; ``backbone_overrides``: set on ``model.backbone``."""
    from mmengine.registry import MODELS, DefaultScope

    cfg = load_config(config, cfg_options)
    scope = cfg.get('default_scope', None)
    register_scope_modules(scope)
    model_cfg = copy.deepcopy(cfg.model)
    if backbone_overrides:
        model_cfg['backbone'].update(backbone_overrides)
    with DefaultScope.overwrite_default_scope(scope), torch.device(device):
        return MODELS.build(model_cfg['backbone'] if backbone_only else model_cfg)
