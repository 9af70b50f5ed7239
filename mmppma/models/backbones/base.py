"""What mmppma's backbones (PPMA/RMT, MLLA, VMINet) share: resolving ``arch`` against an architecture table,
and the standard OpenMMLab backbone fields (``out_indices``, ``frozen_stages``, ``norm_eval``, ``init_cfg`` and
mmseg's ``pretrained``), input checks and layer ids for layer-wise lr decay.

A backbone is a stem (``stem_name``) followed by ``num_stages`` stages (the ModuleList ``stages_name``),
with an optional norm per returned stage (:meth:`StagedBackbone.out_norm_module`).
"""
import copy
import inspect
import warnings
from typing import Callable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from torch.nn.modules.batchnorm import _BatchNorm

from mmppma.utils.checks import check_choice  # noqa: F401  (the backbones' choice check)

from .release import family_format, is_release_layout, load_release_into_backbone, read_checkpoint_state


def resolve_arch_settings(arch: Union[str, dict],
                          zoo: Mapping[str, dict],
                          family: str,
                          required: Sequence[str],
                          optional: Sequence[str] = (),
                          per_stage: Optional[Sequence[str]] = None,
                          defaults: Optional[Callable[[int], dict]] = None) -> dict:
    """A named arch (a key of ``zoo``, any case) or a custom dict -> a full settings dict (a copy).

    For a dict: unknown and missing keys are errors that list the valid ones; ``defaults(num_stages)`` fills
    the optional keys it names; every ``per_stage`` key (default: ``required``) becomes a list with one entry
    per stage (``len(depths)``); depths must be non-negative. Family-specific checks stay with the caller.
    """
    optional_note = f' (optional: {", ".join(optional)})' if optional else ''
    if isinstance(arch, str):
        key = arch.lower()
        if key not in zoo:
            raise ValueError(f'arch={arch!r} is not a known {family} arch; choose one of {", ".join(sorted(zoo))} '
                             f'or pass a dict with keys {", ".join(required)}{optional_note}')
        return copy.deepcopy(dict(zoo[key]))
    if not isinstance(arch, dict):
        raise TypeError(f'arch must be a str ({", ".join(sorted(zoo))}) or a dict; got {type(arch).__name__}')
    unknown = sorted(set(arch) - set(required) - set(optional))
    missing = [k for k in required if k not in arch]
    if unknown or missing:
        raise ValueError(f'custom {family} arch dict: unknown keys {unknown}, missing keys {missing}; valid keys '
                         f'are {", ".join(required)} (required){" and " + ", ".join(optional) if optional else ""}'
                         f'{" (optional)" if optional else ""}')
    arch = copy.deepcopy(dict(arch))
    num_stages = len(arch['depths'])
    for key, value in (defaults(num_stages) if defaults else {}).items():
        arch.setdefault(key, value)
    for key in (required if per_stage is None else per_stage):
        arch[key] = list(arch[key])
        if len(arch[key]) != num_stages:
            raise ValueError(f'custom {family} arch dict: every per-stage list needs {num_stages} entries '
                             f'(len(depths)); {key} has {len(arch[key])}')
    if num_stages < 1 or min(arch['depths']) < 0:
        raise ValueError(f'custom {family} arch dict: depths must be non-negative, one per stage; got '
                         f'{arch["depths"]}')
    return arch


#: ``model.pretrained`` schemes of upstream model zoos (mmengine's checkpoint loaders): weights of other
#: architectures (ResNet, MiT, ...), which mmseg configs set and ``EncoderDecoder`` hands to the backbone.
FOREIGN_ZOO_SCHEMES = ('open-mmlab://', 'openmmlab://', 'torchvision://', 'modelzoo://', 'mmcls://')


def pretrained_init_cfg(backbone: str, pretrained: Optional[str],
                        init_cfg: Optional[Union[dict, List[dict]]]) -> Optional[Union[dict, List[dict]]]:
    """The ``init_cfg`` a backbone uses given mmseg's deprecated ``pretrained`` argument, as mmseg's backbones
    treat it: None -> ``init_cfg`` unchanged; a checkpoint path or URL -> ``dict(type='Pretrained', ...)`` with
    mmseg's deprecation warning. A model-zoo URI (:data:`FOREIGN_ZOO_SCHEMES`) names another architecture's
    weights and is an error, as is setting both ``pretrained`` and ``init_cfg``."""
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str):
        raise TypeError(f'{backbone}: pretrained must be a checkpoint path or URL (str) or None; got '
                        f'{type(pretrained).__name__}')
    how = (f"give {backbone} weights through the backbone's init_cfg instead, e.g. model.backbone.init_cfg="
           "dict(type='Pretrained', checkpoint='ppma_t_backbone.pth') (release checkpoints: convert them with "
           'tools/model_converters/release_to_mmppma.py --family FAMILY --backbone-only)')
    if pretrained.startswith(FOREIGN_ZOO_SCHEMES):
        raise ValueError(f'{backbone}: pretrained={pretrained!r} names the weights of another architecture from '
                         'an upstream model zoo (the config was written for a different backbone). Set '
                         f'model.pretrained=None in the config (or --cfg-options model.pretrained=None) and {how}.')
    if init_cfg is not None:
        raise ValueError(f'{backbone}: pretrained={pretrained!r} and init_cfg={init_cfg!r} are both set; keep '
                         "one (pretrained is mmseg's deprecated spelling of init_cfg=dict(type='Pretrained', "
                         'checkpoint=...))')
    warnings.warn('DeprecationWarning: pretrained is deprecated, please use "init_cfg" instead')
    return dict(type='Pretrained', checkpoint=pretrained)


#: The keywords every backbone takes after its own and passes on to :class:`StagedBackbone`.
SHARED_KEYWORDS = ('drop_path_rate', 'out_indices', 'frozen_stages', 'norm_eval', 'with_cp', 'init_cfg', 'pretrained')


class StagedBackbone(BaseModule):
    """Base class: the standard fields of an OpenMMLab backbone over a stem and stages.

    Every backbone takes the keywords below after its own (keyword-only) and passes them on here; they are
    documented once, here.

    Args:
        arch_settings: the resolved arch (a full settings dict), kept as ``arch_settings``; its ``depths`` (blocks
            per stage, one entry per stage) and ``embed_dims`` (channels per stage) become attributes.
        in_channels: image channels.
        drop_path_rate: stochastic depth, linear from 0 to this over all blocks (:attr:`drop_paths`).
        out_indices: stages whose outputs are returned (negative counts from the end).
        frozen_stages: -1 none; 0 the stem; k >= 1 the stem and stages 0..k-1 (with their downsample and output
            norm). Frozen parts stay in eval mode with ``requires_grad=False``, also after ``train()``.
        norm_eval: keep every BatchNorm in eval mode during training.
        with_cp: gradient checkpointing per block (``use_reentrant=False``), for the stages to apply.
        init_cfg: mmengine init config, e.g. ``dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.
            Without one the family's release init applies, already at construction.
        pretrained: mmseg's deprecated spelling of ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``
            (a path or URL; warns). A model-zoo URI of another architecture (``open-mmlab://``, ``torchvision://``,
            ``mmcls://``) is an error that says how to give weights through ``init_cfg``
            (:func:`pretrained_init_cfg`).

    A subclass resolves its arch, calls ``super().__init__(arch_settings, in_channels, **kwargs)``, builds
    ``self.<stem_name>`` and ``self.<stages_name>`` (stage i's blocks with drop paths ``self.drop_paths[i]``),
    adds its output norms (:meth:`_add_out_norms`) and calls :meth:`_freeze_stages` at the end.
    """
    stem_name = 'patch_embed'
    stages_name = 'layers'
    #: stages map channels-last tokens to ``(stage output, next stage input)``; False: NCHW in, NCHW out
    channels_last_stages = True

    def __init__(self,
                 arch_settings: dict,
                 in_channels: int = 3,
                 *,
                 drop_path_rate: float = 0.0,
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg: Optional[Union[dict, List[dict]]] = None,
                 pretrained: Optional[str] = None,
                 **unknown) -> None:
        if unknown:
            own = [name for name in inspect.signature(type(self).__init__).parameters
                   if name not in ('self', 'kwargs')]
            raise TypeError(f'{type(self).__name__} got unexpected keyword arguments {sorted(unknown)}; its keywords '
                            f'are {", ".join(own)}, and {", ".join(SHARED_KEYWORDS)} (StagedBackbone)')
        super().__init__(init_cfg=pretrained_init_cfg(type(self).__name__, pretrained, init_cfg))
        if not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f'in_channels must be a positive int (3 for RGB); got {in_channels!r}')
        self.in_channels = in_channels
        self.arch_settings = arch_settings
        self.depths: List[int] = list(arch_settings['depths'])
        self.embed_dims: List[int] = list(arch_settings['embed_dims'])
        self.num_stages = len(self.depths)
        self.num_layers = sum(self.depths) + 2  # stem, blocks, everything after the last block
        self.out_indices = self._check_out_indices(out_indices)
        if not -1 <= frozen_stages <= self.num_stages:
            raise ValueError(f'frozen_stages must be in [-1, {self.num_stages}]; got {frozen_stages}')
        self.frozen_stages, self.norm_eval, self.with_cp = frozen_stages, norm_eval, with_cp
        self.drop_paths = self.drop_path_rates(drop_path_rate)

    def drop_path_rates(self, drop_path_rate: float) -> List[List[float]]:
        """Stochastic depth per block, linear from 0 to ``drop_path_rate`` over all blocks, one list per stage."""
        rates = torch.linspace(0, drop_path_rate, sum(self.depths), device='cpu').tolist()
        starts = [sum(self.depths[:i]) for i in range(self.num_stages)]
        return [rates[start:start + depth] for start, depth in zip(starts, self.depths)]

    def _add_out_norms(self, make_norm: Callable[[int], nn.Module]) -> None:
        """Register ``make_norm(i)`` as the output norm of every stage i in ``out_indices``, under the name
        :meth:`out_norm_name` gives."""
        for i in self.out_indices:
            self.add_module(self.out_norm_name(i), make_norm(i))

    def _check_out_indices(self, out_indices: Union[int, Sequence[int]]) -> Tuple[int, ...]:
        if isinstance(out_indices, int):
            out_indices = (out_indices, )
        result = []
        for i in out_indices:
            j = i + self.num_stages if i < 0 else i
            if not 0 <= j < self.num_stages:
                raise ValueError(f'out_indices entry {i} is out of range for {self.num_stages} stages; use '
                                 f'0..{self.num_stages - 1} (or negative indices from the end)')
            result.append(j)
        return tuple(sorted(set(result)))

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'{type(self).__name__} expects images (B, {self.in_channels}, H, W); got '
                             f'{tuple(x.shape)}. Set the backbone\'s in_channels to your data\'s channel count.')

    def forward_stages(self, x: torch.Tensor, indices: Sequence[int]) -> List[torch.Tensor]:
        """Stem, then the stages; the outputs of the stages ``indices`` (non-negative, any order) in stage
        order, as NCHW, each through its output norm where the backbone has one (:meth:`out_norm_module`). The
        stages after the last of ``indices`` are not run. ``forward`` is this with ``out_indices``; timm's
        ``forward_intermediates`` (:mod:`mmppma.timm_models`) asks for other stages of the same modules."""
        self._check_input(x)
        wanted, last = set(indices), max(indices)
        x = getattr(self, self.stem_name)(x)
        outs = []
        for i, stage in enumerate(getattr(self, self.stages_name)):
            if i > last:
                break
            if self.channels_last_stages:
                out, x = stage(x)
            else:
                x = out = stage(x)
            if i in wanted:
                norm = self.out_norm_module(i)
                if norm is not None:
                    out = norm(out)
                outs.append(out.permute(0, 3, 1, 2).contiguous() if self.channels_last_stages else out)
        return outs

    def out_norm_name(self, i: int) -> str:
        """The attribute name of stage i's output norm (default ``outnorm{i}``)."""
        return f'outnorm{i}'

    def out_norm_module(self, i: int) -> Optional[nn.Module]:
        """The norm applied to stage i's output, if any."""
        return getattr(self, self.out_norm_name(i), None)

    @torch.no_grad()
    def _trunc_normal_init(self) -> None:
        """Every Linear trunc_normal(std .02) and bias 0; LayerNorm weight 1, bias 0 (the releases' init)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def init_weights(self) -> None:
        """Apply ``init_cfg`` (e.g. Pretrained with a prefix); without one, keep the release init done at
        construction. A Pretrained checkpoint in a release's own classification layout is converted on load
        (:mod:`.release`; its ``prefix``, meant for mmppma checkpoints, does not apply)."""
        if self.init_cfg is None:
            return
        pretrained = self._pretrained_checkpoint()
        if pretrained is not None and not self._is_init:
            state = read_checkpoint_state(pretrained)
            if is_release_layout(state, family_format(self)):
                load_release_into_backbone(self, state, pretrained)
                self._is_init = True
                return
        super().init_weights()

    def _pretrained_checkpoint(self) -> Optional[str]:
        """The checkpoint of an ``init_cfg`` that is only ``dict(type='Pretrained', checkpoint=...)``."""
        cfg = self.init_cfg[0] if isinstance(self.init_cfg, list) and len(self.init_cfg) == 1 else self.init_cfg
        if isinstance(cfg, Mapping) and cfg.get('type') == 'Pretrained' and isinstance(cfg.get('checkpoint'), str):
            return cfg['checkpoint']
        return None

    def _freeze_stages(self) -> None:
        """frozen_stages k >= 0: the stem; k >= 1 also stages 0..k-1 and their output norms, in eval mode with
        ``requires_grad=False``."""
        if self.frozen_stages < 0:
            return
        frozen = [getattr(self, self.stem_name)]
        stages = getattr(self, self.stages_name)
        for i in range(self.frozen_stages):
            frozen.append(stages[i])
            norm = self.out_norm_module(i) if i in self.out_indices else None
            if norm is not None:
                frozen.append(norm)
        for m in frozen:
            m.eval()
            for p in m.parameters():
                p.requires_grad = False

    def train(self, mode: bool = True) -> 'StagedBackbone':
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def _stage_block_name(self, parts: List[str]) -> Optional[Tuple[int, int]]:
        """(stage, layer id) of a parameter inside ``stages_name`` (names split on '.'), or None. Default
        layout ``{stages_name}.{s}.blocks.{b}``: block b of stage s is 1 + sum(depths[:s]) + b; anything else of
        the stage (its downsample) goes with the stage's last block."""
        if parts[0] != self.stages_name or len(parts) <= 2:
            return None
        stage = int(parts[1])
        first = 1 + sum(self.depths[:stage])
        if parts[2] == 'blocks':
            return stage, first + int(parts[3])
        return stage, first + max(self.depths[stage] - 1, 0)

    def get_layer_depth(self, param_name: str, prefix: str = '') -> Tuple[int, int]:
        """Layer id of a parameter for layer-wise lr decay: (layer_id, num_layers). The stem is 0; blocks per
        :meth:`_stage_block_name`; output norms and anything outside the backbone (no ``prefix``)
        num_layers - 1."""
        num_layers = self.num_layers
        if not param_name.startswith(prefix):
            return num_layers - 1, num_layers
        parts = param_name[len(prefix):].split('.')
        if parts[0] == self.stem_name:
            return 0, num_layers
        found = self._stage_block_name(parts)
        return (found[1] if found else num_layers - 1), num_layers

