"""Optimizer wrapper constructor with layer-wise lr decay and the release's weight-decay exclusions.

Works for any mmpretrain / mmdet / mmseg model whose ``backbone`` has ``get_layer_depth(name, prefix)``
(every mmppma backbone, and upstream backbones that define it), or for a bare backbone.
"""
import logging
from typing import Dict, List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from mmppma.registry import register_optim_wrapper_constructor

from .paramwise_optim_wrapper_constructor import ParamwiseOptimWrapperConstructor

NORMS = (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)
PARAMWISE_KEYS = ('layer_decay_rate', 'no_decay_names', 'custom_keys')


@register_optim_wrapper_constructor
class LayerDecayOptimWrapperConstructor(ParamwiseOptimWrapperConstructor):
    """Param groups with ``lr = base_lr * layer_decay_rate ** (num_layers - 1 - layer_id) * lr_mult`` and
    ``weight_decay = 0`` for 1-D parameters, biases, normalization layers and names containing any of
    ``no_decay_names`` (default: the decay parameters ``A_log``, ``dt_bias``).

    ``paramwise_cfg`` keys:
        layer_decay_rate (float): 1.0 (default) disables layer-wise decay; < 1 needs a backbone with
            ``get_layer_depth`` (``model.backbone`` or the model itself).
        no_decay_names (Sequence[str]): substrings of parameter names excluded from weight decay.
        custom_keys (dict): ``{substring: dict(lr_mult=..., decay_mult=...)}``, multiplied on top (longest
            matching key wins), as in mmengine's default constructor.

    Example::

        optim_wrapper = dict(
            type='AmpOptimWrapper', optimizer=dict(type='AdamW', lr=1e-4, weight_decay=0.05),
            constructor='mmppma.LayerDecayOptimWrapperConstructor',
            paramwise_cfg=dict(layer_decay_rate=0.9))
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None) -> None:
        # an empty paramwise_cfg would make the parent skip add_params: keep ours non-empty
        paramwise_cfg = dict(paramwise_cfg or {})
        paramwise_cfg.setdefault('layer_decay_rate', 1.0)
        super().__init__(optim_wrapper_cfg, paramwise_cfg)

    def _validate_cfg(self) -> None:
        super()._validate_cfg()
        unknown = sorted(set(self.paramwise_cfg) - set(PARAMWISE_KEYS))
        if unknown:
            raise ValueError(f'{type(self).__name__}: unknown paramwise_cfg keys {unknown}; valid keys are '
                             f'{", ".join(PARAMWISE_KEYS)} (use mmengine\'s DefaultOptimWrapperConstructor for '
                             f'its other options)')
        rate = self.paramwise_cfg['layer_decay_rate']
        if not 0 < rate <= 1:
            raise ValueError(f'layer_decay_rate must be in (0, 1]; got {rate}')
        if self.base_lr is None:
            raise ValueError(f'{type(self).__name__} needs optimizer.lr to scale per layer')

    @staticmethod
    def _depth_source(model: nn.Module) -> Tuple[Optional[nn.Module], str]:
        backbone = getattr(model, 'backbone', None)
        if backbone is not None and hasattr(backbone, 'get_layer_depth'):
            return backbone, 'backbone.'
        if hasattr(model, 'get_layer_depth'):
            return model, ''
        return None, ''

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '', **kwargs) -> None:
        """Fill ``params`` with one group per (layer, weight decay, custom key) for all of ``module``."""
        rate = self.paramwise_cfg['layer_decay_rate']
        no_decay_names = tuple(self.paramwise_cfg.get('no_decay_names', ('A_log', 'dt_bias')))
        custom_keys: Dict[str, dict] = self.paramwise_cfg.get('custom_keys', {})
        sorted_keys = sorted(sorted(custom_keys), key=len, reverse=True)
        depth_source, depth_prefix = self._depth_source(module)
        if depth_source is None and rate != 1.0:
            raise ValueError(f'layer_decay_rate={rate} needs model.backbone.get_layer_depth(name, prefix); '
                             f'{type(module).__name__} has none. Use a backbone that defines it (PPMA, RMT) or '
                             f'set layer_decay_rate=1.0.')
        norm_params = {id(p) for m in module.modules() if isinstance(m, NORMS) for p in m.parameters(recurse=False)}
        base_wd = self.base_wd or 0.0
        groups: Dict[tuple, dict] = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue  # frozen (e.g. frozen_stages): nothing to optimize
            full_name = f'{prefix}.{name}' if prefix else name
            no_decay = (param.ndim <= 1 or name.endswith('.bias') or id(param) in norm_params
                        or any(key in name for key in no_decay_names))
            if depth_source is not None:
                layer_id, num_layers = depth_source.get_layer_depth(name, prefix=depth_prefix)
            else:
                layer_id, num_layers = 0, 1
            lr_scale = rate**(num_layers - 1 - layer_id)
            custom = next((key for key in sorted_keys if key in full_name), None)
            lr_mult = custom_keys[custom].get('lr_mult', 1.0) if custom else 1.0
            decay_mult = custom_keys[custom].get('decay_mult', 1.0) if custom else 1.0
            group_key = (layer_id, no_decay, custom)
            if group_key not in groups:
                groups[group_key] = dict(
                    params=[],
                    param_names=[],
                    lr=self.base_lr * lr_scale * lr_mult,
                    weight_decay=0.0 if no_decay else base_wd * decay_mult,
                    layer_id=layer_id,
                    lr_scale=lr_scale)
            groups[group_key]['params'].append(param)
            groups[group_key]['param_names'].append(full_name)
        params.extend(groups.values())
        print_log(
            f'{type(self).__name__}: {len(groups)} param groups, layer_decay_rate={rate}, '
            f'{sum(len(g["params"]) for g in groups.values() if g["weight_decay"] == 0)} tensors without weight '
            f'decay', logger='current', level=logging.INFO)
