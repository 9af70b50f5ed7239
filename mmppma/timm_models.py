"""mmppma's classifiers in timm: ``import mmppma`` registers every variant of every registered family (PPMA, RMT,
MLLA, PPMLA and VMINet; :mod:`mmppma.models.backbones.family`), every size, with timm as ``<variant>_<size>``, so
that ``timm.create_model(name, pretrained=True)``, ``features_only=True`` and timm's data config work. A family
registered later is registered with timm then.

A timm model here is :class:`MMPPMAClassifier`: the backbone class mmpretrain, mmdet and mmseg build (the
same modules) under ``backbone``, and the family's release classification head under ``head`` (PPMA / RMT:
:class:`~mmppma.models.heads.PPMAClsHead`; MLLA / PPMLA / VMINet: average pool and ``head.fc``, the keys of
mmpretrain's ``LinearClsHead``; :func:`~mmppma.models.heads.release_head`), so an mmpretrain checkpoint of the same
classifier loads key for key.

* Classification (the default): the backbone as the release classifier has it: one output, the last stage's
  (PPMA / RMT without a norm; MLLA / PPMLA with the release's final LayerNorm ``norm3``; VMINet with its
  BatchNorm ``norm3``).
* ``features_only=True``: the backbone as the mmdet / mmseg configs build it (``out_indices=(0, 1, 2, 3)``,
  a LayerNorm on each output), wrapped in timm's ``FeatureGetterNet``, which calls
  :meth:`MMPPMAClassifier.forward_intermediates`: its maps are the dense backbone's.

Weights: ``pretrained=True`` reads the release file the pretrained cfg's ``url`` names (the model index's
``Weights``, ``mmppma/.mim/metafiles``) with mmengine's checkpoint loaders, as the rest of mmppma reads it
(the release hosts' files are cached under a name unique to the URL, :mod:`mmppma.utils.model_zoo`), and
:func:`checkpoint_filter_fn` (timm's ``pretrained_filter_fn``) converts it with the family's release format.
``pretrained_cfg_overlay=dict(file=PATH)`` does the same with a local release or mmppma checkpoint. Names
whose release publishes no direct download have no ``url``; ``pretrained=True`` then raises an error that
says where the weights are published and how to pass a file. timm's ``checkpoint_path=`` and the model's
``load_state_dict`` take a release state dict too (converted by the load hook ``import mmppma`` gives every
parent of an mmppma backbone, :mod:`mmppma.models.backbones.release`).

Eval settings (``pretrained_cfg``): 224 x 224, resize the short side to 256 (crop 0.875) bicubic, center crop,
ImageNet mean and std: the test pipeline of the configs (mmpretrain's ``imagenet_bs64_swin_224``).
"""
import functools
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import timm
import torch
import torch.nn as nn
import yaml
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._pretrained import PretrainedCfg
from timm.models._registry import get_pretrained_cfg

from .models.backbones.family import FamilySpec, Variant, on_register
from .models.backbones.release import (
    CheckpointMismatchError,
    _log,
    check_keys,
    convert_and_check,
    family_format,
    is_release_layout,
    read_checkpoint_state,
    unwrap_state,
)
from .models.heads import release_head, set_classifier

METAFILES = Path(__file__).resolve().parent / '.mim' / 'metafiles'
#: timm's family name (a variant's key) -> the variant, for every registered family
TIMM_FAMILIES: Dict[str, Variant] = {}
#: timm name -> (family, size), e.g. 'vminet_xsmall' -> ('vminet', 'xsmall')
MODEL_NAMES: Dict[str, Tuple[str, str]] = {}
NUM_STAGES = 4


def _spec(family: str) -> FamilySpec:
    return TIMM_FAMILIES[family].family


@functools.lru_cache(maxsize=None)
def _metafile_models(metafile: str) -> list:
    """The ``Models`` of a metafile, parsed once."""
    return yaml.safe_load((METAFILES / metafile / 'metafile.yml').read_text())['Models']


def _index_entry(family: str, size: str) -> Optional[dict]:
    """The model index's classification entry of a named size (``mmppma_<family>-<arch>_3rdparty_in1k`` or,
    without release weights, ``..._in1k``), or None."""
    variant = TIMM_FAMILIES[family]
    if variant.metafile is None:
        return None
    arch = _spec(family).sizes[size]
    names = (f'mmppma_{variant.metafile}-{arch}_3rdparty_in1k', f'mmppma_{variant.metafile}-{arch}_in1k')
    return next((m for m in _metafile_models(variant.metafile) if m['Name'] in names), None)


def release_url(name: str) -> Optional[str]:
    """The release file's direct URL of a registered name, as the model index lists it (None: no download)."""
    entry = _index_entry(*MODEL_NAMES[name])
    return entry.get('Weights') if entry else None


def _eval_cfg(name: str) -> dict:
    family, _ = MODEL_NAMES[name]
    variant = TIMM_FAMILIES[family]
    cfg = dict(num_classes=1000, input_size=(3, 224, 224), pool_size=(7, 7), crop_pct=0.875, crop_mode='center',
               interpolation='bicubic', mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
               first_conv=f'backbone.{_spec(family).stem}', classifier='head.fc', fixed_input_size=False,
               origin_url=variant.code)
    if variant.paper:
        cfg['paper_ids'] = variant.paper
    url = release_url(name)
    if url:
        cfg.update(url=url, notes=('the release file, converted on load (mmppma.timm_models.checkpoint_filter_fn)', ))
    return cfg


def _default_cfgs(names: Sequence[str]) -> dict:
    """``name.in1k`` for the names with a release download, the untagged name for the others."""
    cfgs = {}
    for name in names:
        cfg = _eval_cfg(name)
        cfgs[f'{name}.in1k' if cfg.get('url') else name] = cfg
    return generate_default_cfgs(cfgs)


class MMPPMAClassifier(nn.Module):
    """An mmppma backbone and the release classification head, with timm's model interface.

    Args:
        family: a key of :data:`TIMM_FAMILIES` (a variant's: 'ppma', 'rmt', 'mlla', 'ppmla', 'vminet').
        arch: the backbone's arch: a name of its arch table or a custom dict (see the backbone class).
        num_classes: classes; 0 gives the pooled pre-logits features.
        global_pool: 'avg' or '' (no pooling: ``forward`` gives maps).
        in_chans: image channels (the backbone's ``in_channels``).
        dense_outputs: build the backbone as the mmdet / mmseg configs do (every stage an output with its
            LayerNorm), as ``features_only=True`` does; otherwise as the release classifier.
        **kwargs: the backbone's own keywords (``drop_path_rate``, ``impl``, VMINet's ``context_mask`` /
            ``proj_norm``, ...), over the variant's options.
    """

    def __init__(self, family: str, arch: Union[str, dict], num_classes: int = 1000, global_pool: str = 'avg',
                 in_chans: int = 3, *, dense_outputs: bool = False, **kwargs) -> None:
        super().__init__()
        if family not in TIMM_FAMILIES:
            raise ValueError(f'family={family!r}; choose one of {", ".join(TIMM_FAMILIES)}')
        variant, spec = TIMM_FAMILIES[family], _spec(family)
        for name in ('out_indices', 'out_norm'):
            if name in kwargs:
                raise TypeError(f'{name} is set by the timm model: features_only=True gives the dense backbone '
                                f'(every stage, with its output norm), and timm\'s out_indices picks stages of it')
        outputs = dict(out_indices=tuple(range(NUM_STAGES)), **spec.dense_options) if dense_outputs else \
            dict(out_indices=(-1, ), **spec.classifier_options)
        self.family, self.dense_outputs = family, dense_outputs
        self.backbone = variant.build(arch, in_chans, **kwargs, **outputs)
        self.num_stages = len(self.backbone.depths)
        if dense_outputs and self.num_stages != NUM_STAGES:
            raise ValueError(f'dense outputs are for {NUM_STAGES} stages; the arch has {self.num_stages}')
        self.num_features = self.backbone.embed_dims[-1]
        self.head = release_head(spec.head, self.num_features, 0)
        self.head_hidden_size = self.head.hidden_channels
        self.global_pool = ''
        self.reset_classifier(num_classes, global_pool)
        stages = self.backbone.stages_name
        self.feature_info = [dict(num_chs=c, reduction=2**(i + 2), module=f'backbone.{stages}.{i}')
                             for i, c in enumerate(self.backbone.embed_dims)]

    # ------------------------------------------------------------ classifier
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new ``head.fc`` for ``num_classes`` (0: none), initialized as the release (trunc_normal .02, bias
        0); ``global_pool`` 'avg' or '' (None keeps it)."""
        if global_pool is not None:
            if global_pool not in ('avg', ''):
                raise ValueError(f"global_pool={global_pool!r}; mmppma's heads average-pool: use 'avg' or '' "
                                 '(no pooling)')
            self.global_pool = global_pool
        if not isinstance(num_classes, int) or num_classes < 0:
            raise ValueError(f'num_classes must be an int >= 0 (0: no classifier); got {num_classes!r}')
        set_classifier(self.head, num_classes)
        self.num_classes = num_classes

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Every block under ``torch.utils.checkpoint`` while grad mode is on (the backbone's ``with_cp``)."""
        self.backbone.with_cp = enable
        for stage in getattr(self.backbone, self.backbone.stages_name):
            stage.with_cp = enable

    # ------------------------------------------------------------ forward
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, in_chans, H, W) -> the last stage's map (B, num_features, ceil(H/32), ceil(W/32)), through
        its output norm where the model has one."""
        return self.backbone.forward_stages(x, [self._last_stage()])[0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """forward_features' map -> logits; ``pre_logits``: the pooled (B, head_hidden_size) features."""
        x = self.head.project(x)
        if self.global_pool:
            x = x.mean(dim=(2, 3))  # as PPMAClsHead.pre_logits and mmpretrain's GlobalAveragePooling
        if pre_logits:
            return x
        if x.dim() == 4:  # no pooling: the classifier at every position
            return self.head.fc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: Optional[Union[int, List[int]]] = None,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = 'NCHW',
                              intermediates_only: bool = False):
        """Stage outputs (timm's API): ``indices`` (None: every stage; n: the last n; a list: those stages)
        as NCHW (or NHWC) maps, each through the stage's output norm where the model has one (with
        ``features_only`` / ``dense_outputs``: the mmdet / mmseg backbone's outputs). Returns the list, or with
        ``intermediates_only=False`` (forward_features' map, the list); ``stop_early`` runs no stage after the
        last index, and the map returned is that stage's. ``norm=True`` is an error: the output norms belong
        to each stage, there is no final norm to add."""
        if norm:
            raise ValueError('norm=True: the output norms are per stage and already applied where the model has '
                             'them; create the model with features_only=True (or dense_outputs=True) for the dense '
                             "backbone's normed outputs, and call with norm=False")
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f"output_fmt={output_fmt!r}; choose 'NCHW' or 'NHWC'")
        take, max_index = feature_take_indices(self._last_stage() + 1, indices)
        last = max_index if intermediates_only or stop_early else self._last_stage()
        outs = dict(zip(sorted(set(take) | {last}), self.backbone.forward_stages(x, sorted(set(take) | {last}))))
        intermediates = [outs[i] for i in take]
        if output_fmt == 'NHWC':
            intermediates = [t.permute(0, 2, 3, 1) for t in intermediates]
        if intermediates_only:
            return intermediates
        return outs[last], intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the stages after the last of ``indices`` (and their output norms) and, with ``prune_head``, the
        classifier; returns the stage indices. ``prune_norm`` removes nothing: the output norms are part of the
        stage outputs (the dense backbone's), not a final norm."""
        take, max_index = feature_take_indices(self._last_stage() + 1, indices)
        backbone = self.backbone
        stages = getattr(backbone, backbone.stages_name)
        for i in range(max_index + 1, len(stages)):
            if backbone.out_norm_module(i) is not None:
                delattr(backbone, backbone.out_norm_name(i))
        setattr(backbone, backbone.stages_name, stages[:max_index + 1])
        backbone.out_indices = tuple(i for i in backbone.out_indices if i <= max_index)
        if prune_head:
            self.reset_classifier(0, '')
        return take

    def _last_stage(self) -> int:
        return len(getattr(self.backbone, self.backbone.stages_name)) - 1


# ---------------------------------------------------------------- weights
_OUT_NORM = re.compile(r'backbone\.(out)?norm\d+\.')


def _fillable(key: str) -> bool:
    """Keys a checkpoint of the other layout may lack or carry: output norms (a classification release has the
    final one only, a dense backbone one per stage) and the head (a dense backbone has none)."""
    return bool(_OUT_NORM.match(key)) or key.startswith('head.')


def checkpoint_filter_fn(state_dict: Mapping[str, torch.Tensor], model: MMPPMAClassifier) -> Dict[str, torch.Tensor]:
    """timm's ``pretrained_filter_fn``: a release classification state dict (converted and checked by
    :func:`~mmppma.models.backbones.release.convert_and_check`, the family's release format) or an mmppma one
    (``backbone.*`` / ``head.*``: an mmpretrain classifier, or an mmdet / mmseg model, whose other modules are
    left out) -> ``model``'s state dict.

    The output norms and head a checkpoint of the other layout has no weights for (a classification release
    into the dense ``features_only`` backbone, a dense backbone into a classifier) keep the model's
    initialization, and the log names them; every other key must match in name and shape
    (:class:`~mmppma.models.backbones.release.CheckpointMismatchError` names those that do not).
    """
    backbone = model.backbone
    fmt, name = family_format(backbone), type(backbone).__name__
    state = dict(unwrap_state(state_dict))
    expected = model.state_dict()
    # head.fc: timm drops it when the model's num_classes differs from the checkpoint's
    rules = dict(keep=_fillable, drop=_fillable, loose_shapes=lambda k: k.startswith('head.fc.'))
    if is_release_layout(state, fmt):
        where = f'{fmt.FAMILY} release checkpoint -> timm {name} classifier'
        hint = (f'The timm {name} model takes a {fmt.FAMILY} release or mmppma checkpoint of its own family and '
                'size; backbone options go to timm: timm.create_model(name, pretrained=True, OPTION=VALUE, '
                'pretrained_cfg_overlay=...)')
        converted, conversion = convert_and_check(state, fmt, expected, where, check_record=getattr(
            backbone, 'check_release_record', None), arch_zoo=type(backbone).arch_zoo, hint=hint, **rules)
        kept = conversion.info['kept']
    elif any(k.startswith('backbone.') for k in state):
        others = sorted({k.split('.')[0] for k in state if not k.startswith(('backbone.', 'head.'))})
        where = f'mmppma checkpoint -> timm {name} classifier'
        converted, kept, unused = check_keys({k: v for k, v in state.items() if k.startswith(('backbone.', 'head.'))},
                                             expected, where, **rules)
        _log(f'{where}: {len(converted)} tensors; left out: {others + unused}; {len(kept)} tensors the checkpoint '
             f'has no weights for keep their initialization: {kept}')
    else:
        raise CheckpointMismatchError(
            f'{name} weights: the state dict is neither a {fmt.FAMILY} release classification checkpoint (backbone '
            f'keys at the root and head.weight) nor an mmppma one (backbone.* keys); its keys start with '
            f'{sorted(state)[:5]}. Pass a release file or an mmppma checkpoint as '
            'pretrained_cfg_overlay=dict(file=PATH)')
    return {**converted, **{k: expected[k] for k in kept}}


def _no_weights_message(name: str, cfg: PretrainedCfg) -> str:
    family, _ = MODEL_NAMES[name]
    return (f'{name}: {TIMM_FAMILIES[family].no_weights or "no direct download of its weights"}. Pass a file you '
            f"have (the release's, or an mmppma checkpoint): timm.create_model('{name}', pretrained=True, "
            "pretrained_cfg_overlay=dict(file='/path/to/checkpoint.pth'))")


def _resolve_pretrained(name: str, pretrained_cfg, overlay: Optional[dict]) -> dict:
    """The overlay with ``state_dict``: the checkpoint named by the overlay's ``file`` or the cfg's ``url``,
    read with mmengine's checkpoint loaders (their weights_only allowlist, the release hosts' cache names)."""
    overlay = dict(overlay or {})
    if overlay.get('state_dict') is not None:
        return overlay
    if isinstance(pretrained_cfg, str) or pretrained_cfg is None:
        cfg = get_pretrained_cfg(f'{name}.{pretrained_cfg}' if pretrained_cfg else name)
        if cfg is None:
            raise RuntimeError(f'{name}: no pretrained cfg {pretrained_cfg!r}; the tags are '
                               f'{[t for t in timm.list_models(name, pretrained=True)]}')
        cfg = cfg.to_dict()
    else:
        cfg = pretrained_cfg.to_dict() if isinstance(pretrained_cfg, PretrainedCfg) else dict(pretrained_cfg)
    cfg.update(overlay)
    source = cfg.get('file') or cfg.get('url')
    if not source:
        raise RuntimeError(_no_weights_message(name, cfg))
    overlay['state_dict'] = read_checkpoint_state(str(source))
    return overlay


def _create(name: str, pretrained: bool = False, **kwargs) -> nn.Module:
    family, size = MODEL_NAMES[name]
    feature_cls = kwargs.get('feature_cls', 'getter')
    if kwargs.get('features_only') and feature_cls != 'getter':
        raise ValueError(f"feature_cls={feature_cls!r}: mmppma's timm models give features through "
                         "forward_intermediates; use feature_cls='getter' (the default)")
    if kwargs.get('features_only'):
        kwargs.setdefault('dense_outputs', True)
    if pretrained:
        kwargs['pretrained_cfg_overlay'] = _resolve_pretrained(name, kwargs.get('pretrained_cfg'),
                                                               kwargs.get('pretrained_cfg_overlay'))
    kwargs.setdefault('arch', _spec(family).sizes[size])
    model = build_model_with_cfg(MMPPMAClassifier, name, pretrained, family=family,
                                 pretrained_filter_fn=checkpoint_filter_fn,
                                 feature_cfg=dict(feature_cls='getter', out_indices=tuple(range(NUM_STAGES))),
                                 **kwargs)
    for module in (model, getattr(model, 'model', None)):  # a features model wraps the classifier
        cfg = getattr(module, 'pretrained_cfg', None)
        if isinstance(cfg, dict):
            cfg.pop('state_dict', None)  # the weights are in the model; do not keep a second reference
    return model


def _entrypoint(name: str):
    def create(pretrained: bool = False, **kwargs) -> nn.Module:
        return _create(name, pretrained=pretrained, **kwargs)

    family, size = MODEL_NAMES[name]
    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = (f'{TIMM_FAMILIES[family].backbone.__name__} ({family}, arch {_spec(family).sizes[size]!r}) '
                      'classifier; see mmppma.timm_models.')
    return create


#: the pretrained cfgs timm's register_model reads (``default_cfgs`` of this module)
default_cfgs: dict = {}
__all__ = ['MMPPMAClassifier', 'checkpoint_filter_fn', 'release_url', 'TIMM_FAMILIES', 'MODEL_NAMES']


def register_family(spec: FamilySpec) -> None:
    """Register every variant and size of a family with timm (``<variant>_<size>``, :data:`MODEL_NAMES`): each
    family registered with :func:`~mmppma.models.backbones.family.register_family`, now or later."""
    names = [f'{v.key}_{size}' for v in spec.variants for size in spec.sizes]
    for variant in spec.variants:
        TIMM_FAMILIES[variant.key] = variant
        MODEL_NAMES.update({f'{variant.key}_{size}': (variant.key, size) for size in spec.sizes})
    default_cfgs.update(_default_cfgs(names))
    for name in names:
        globals()[name] = register_model(_entrypoint(name))


on_register(register_family)


def registered_names(pretrained: bool = False) -> Sequence[str]:
    """The timm names this module registers (with ``pretrained``: the tags with a release download)."""
    return [n for n in timm.list_models(module='timm_models', pretrained=pretrained) if n.split('.')[0] in MODEL_NAMES]

