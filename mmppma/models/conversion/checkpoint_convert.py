"""Release checkpoints <-> mmppma checkpoints, checked: the converter behind
``tools/model_converters/release_to_mmppma.py`` and whole-model conversion, for every registered family (PPMA with
RMT, MLLA, VMINet; layout: docs/method.md §8, docs/checkpoints.md), each through its spec
(:mod:`mmppma.models.backbones.family`).

Each family's key map and revision rules are data beside its backbone (its spec's release format, applied by
:func:`~mmppma.models.backbones.release.from_release`). This module adds what needs the models: the arch detected
from the shapes, and a check of every key and shape against a reference model built on the meta device from the
backbone's arch table (or from a given config); anything missing, unexpected or mis-shaped raises
:class:`CheckpointMismatchError` listing the keys. The default config to load a converted classifier with is named
in ``info['config']`` relative to the mmppma repository (``configs/...``, the spec's); no file is read here unless
a config is given.
"""
import functools
import inspect
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple, Union

import torch

from ..backbones.family import FamilySpec, family_of, variant_of
from ..backbones.release import (
    CheckpointMismatchError,
    Conversion,
    convert_and_check,
    extract_state_dict,
    match_arch_name,
    with_release_record,
)
from ..backbones.release import prefixed as _prefixed
from ..heads import release_head

__all__ = ['CheckpointMismatchError', 'check_family', 'canonical_arch', 'extract_state_dict',
           'match_arch', 'release_to_mmppma', 'mmppma_to_release', 'with_release_record']



def check_family(family: str) -> str:
    """'ppma' / 'RMT' / 'mlla' / ... -> the name of its registered family ('RMT' is 'PPMA')."""
    return family_of(family).name


def canonical_arch(family: str, arch: str) -> str:
    """'tiny' / 'T' / 't' ... -> the family's canonical arch name ('tiny' for PPMA, 't' for MLLA, 'ti' for VMINet)."""
    return family_of(family).canonical_arch(arch)


def match_arch(family: str, measured: dict) -> str:
    """The canonical arch name whose table entry equals the measured settings (from the family's ``measure``)."""
    spec = family_of(family)
    fmt, zoo = spec.release, spec.arch_zoo
    name = match_arch_name(zoo, spec.arch_names, measured, fmt.IMPLIED)
    if name is not None:
        return name
    shown = ', '.join(f'{k}={v}' for k, v in measured.items() if k in zoo[spec.arch_names[0]])
    hint = (f'pass arch=dict(...) with {spec.custom_arch} (converter --arch-json)' if spec.custom_arch else
            'pass a config whose model matches (converter --config)')
    raise CheckpointMismatchError(f'{spec.name} backbone ({shown}) matches no named arch '
                                  f'({", ".join(spec.arch_names)}); {hint}')


# ---------------------------------------------------------------- reference models
def build_reference_backbone(variant: str, arch: Union[str, dict], **kwargs) -> torch.nn.Module:
    """The backbone of ``variant`` (a family or variant name: 'PPMA', 'RMT', 'MLLA', 'VMINet', ...) from its arch
    table, on the meta device (shapes only), for key/shape checks."""
    with torch.device('meta'):
        return variant_of(variant).build(arch, **kwargs)


def build_model_from_config(config: Union[str, Path], backbone_overrides: Optional[dict] = None,
                            backbone_only: bool = False, device: Union[str, torch.device] = 'meta'):
    """The config's mmpretrain model (or only its backbone), with ``backbone_overrides`` applied, on ``device``
    ('meta': shapes only, no memory; :func:`mmppma.utils.configs.build_config_model`)."""
    from mmppma.utils.configs import build_config_model, load_config
    cfg = load_config(config)
    cfg.model.pop('train_cfg', None)  # batch augments: no state, only a log line
    return build_config_model(cfg, backbone_only=backbone_only, backbone_overrides=backbone_overrides, device=device)


@functools.lru_cache(maxsize=None)
def _config_shapes(config: str, overrides: Tuple[Tuple[str, object], ...], backbone_only: bool) -> dict:
    model = build_model_from_config(config, dict(overrides), backbone_only)
    return {k: torch.empty(v.shape, device='meta') for k, v in model.state_dict().items()}


def config_reference_state(config: Union[str, Path], backbone_overrides: Optional[dict] = None,
                           backbone_only: bool = False) -> Dict[str, torch.Tensor]:
    """Keys -> meta tensors of the model built from ``config`` (cached per config and overrides)."""
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (backbone_overrides or {}).items()))
    return dict(_config_shapes(str(config), items, backbone_only))


def check_config_options(config: Union[str, Path], spec: FamilySpec, info: dict) -> None:
    """The config's backbone must have the options of the release revision the keys show (``info['release']``)."""
    from mmppma.utils.configs import load_config
    backbone = load_config(config).model.backbone
    defaults = inspect.signature(variant_of(info['family']).backbone.__init__).parameters
    release = info['release']
    needed = {k: v for k, v in release.items() if k != 'revision'}
    has = {k: backbone.get(k, defaults[k].default) for k in needed}
    wrong = {k: v for k, v in needed.items() if has[k] != v}
    if wrong:
        named = spec.revision_config.format(variant=info['family'].lower(), arch='<arch>', revision=release['revision'])
        raise CheckpointMismatchError(
            f'{config}: model.backbone has ' + ', '.join(f'{k}={has[k]!r}' for k in wrong)
            + f'; the release revision {release["revision"]} needs ' + ', '.join(f'{k}={v!r}' for k, v in wrong.items())
            + f' ({named} has them)')


def _outputs(spec: FamilySpec, measured: dict, downstream: bool) -> dict:
    """The output options of the backbone the converted state fits: a downstream state's output norms (every stage
    an output where it has none, which gives the same keys), else the release classifier's (the last stage)."""
    if downstream:
        return dict(out_indices=measured['out_norms'] or tuple(range(len(measured['depths']))),
                    out_norm=measured['out_norm'])
    return dict(out_indices=(len(measured['depths']) - 1, ), **spec.classifier_options)


def _reference_backbone_state(spec: FamilySpec, conversion: Conversion,
                              arch: Union[str, dict]) -> Dict[str, torch.Tensor]:
    """The backbone the converted state must fit, from the arch table, with the options the weights need."""
    info = conversion.info
    options = {**spec.weight_options(conversion), **info['backbone_overrides'],
               **_outputs(spec, conversion.measured, info['downstream'])}
    return build_reference_backbone(info['family'], arch, **options).state_dict()


def _classifier_head(spec: FamilySpec, head: dict, backbone_dims: int, info: dict) -> Dict[str, torch.Tensor]:
    """The head the converted state must fit, from the checkpoint's class count: the family's release head
    (:func:`~mmppma.models.heads.release_head`) on the last stage's channels."""
    if 'head.fc.weight' not in head:
        raise CheckpointMismatchError('classification checkpoint without head (no head.weight); convert with '
                                      'backbone_only=True (--backbone-only)')
    num_classes, hidden = head['head.fc.weight'].shape
    info['num_classes'] = num_classes
    if num_classes != 1000:
        info['notes'].append(f'{num_classes} classes: set model.head.num_classes={num_classes}')
    with torch.device('meta'):
        ref = release_head(spec.head, backbone_dims, num_classes, hidden)
    return _prefixed(ref.state_dict(), 'head.')


def _config_reference(spec: FamilySpec, conversion: Conversion, config, backbone_only: bool) -> Dict[str, torch.Tensor]:
    """The keys and shapes of the model of a given mmpretrain config (classification: the classifier, its head
    for the checkpoint's class count; downstream: its backbone with the checkpoint's output norms)."""
    info, measured, head = conversion.info, conversion.measured, conversion.head
    if info['release']:
        check_config_options(config, spec, info)
    overrides = info['backbone_overrides']
    if info['downstream']:
        dense = _outputs(spec, measured, downstream=True)
        return _prefixed(config_reference_state(config, dict(overrides, **dense), backbone_only=True), 'backbone.')
    ref = config_reference_state(config, overrides)
    if backbone_only:
        return {k: v for k, v in ref.items() if k.startswith('backbone.')}
    if 'head.fc.weight' not in head:
        raise CheckpointMismatchError('classification checkpoint without head (no head.weight); convert with '
                                      'backbone_only=True (--backbone-only)')
    num_classes = head['head.fc.weight'].shape[0]
    if 'head.fc.weight' in ref and ref['head.fc.weight'].shape[0] != num_classes:
        ref['head.fc.weight'] = torch.empty(num_classes, ref['head.fc.weight'].shape[1], device='meta')
        ref['head.fc.bias'] = torch.empty(num_classes, device='meta')
        info['notes'].append(f'{num_classes} classes: set model.head.num_classes={num_classes}')
    info['num_classes'] = num_classes
    return ref


# ---------------------------------------------------------------- the API
def release_to_mmppma(state: Mapping[str, torch.Tensor],
                      family: str,
                      backbone_only: bool = False,
                      arch: Optional[Union[str, dict]] = None,
                      config: Optional[Union[str, Path]] = None,
                      check: bool = True) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Convert a release state dict (classification, or ``backbone.``-prefixed downstream) of ``family``
    (a registered family or variant: 'PPMA' / 'RMT', 'MLLA', 'VMINet') to mmppma keys, through
    :func:`~mmppma.models.backbones.release.convert_and_check` against a reference model.

    Returns (state dict, info). Classification: ``backbone.*`` + the family's release head (PPMA:
    ``head.{proj,norm,fc}.*`` of PPMAClsHead; MLLA / VMINet: the release's final ``norm`` as ``backbone.norm{last}``
    and ``head.fc.*`` of mmpretrain's LinearClsHead). Downstream: the backbone under ``backbone.`` (its output norms
    kept), the detector's / segmentor's own keys passed through unchecked unless ``backbone_only``.
    ``backbone_only``: only ``backbone.*`` keys (for ``init_cfg=dict(type='Pretrained', prefix='backbone.')``).

    ``arch``: detected from shapes unless given (a name, or a settings dict). ``check``: every key and shape
    against the reference model, built from the arch table with the options the weights need, or from ``config``
    (an mmpretrain classification config) when given; a state of a release revision (VMINet) needs a config with
    the revision's options.

    ``info``: family (the variant: 'PPMA' | 'RMT' | 'MLLA' | 'VMINet'), arch, config (the given one, else the
    repository config to load a converted classifier with, relative to the repository root, e.g.
    ``configs/mlla_t_8xb128_in1k.py``; None for a custom arch or one the repository has no config for),
    downstream, out_indices, backbone_overrides (settings the checkpoint needs that differ from the backbone's
    defaults), dropped (release buffers with no counterpart), passthrough keys, num_classes, notes, mask (PPMA),
    and ``revision`` / ``release`` (VMINet: the record revision, context_mask, proj_norm; None for a downstream
    state in mmppma's layout). A state of a release revision comes back carrying the record
    (:func:`with_release_record`, under the family's ``FamilySpec.record``).
    """
    spec = family_of(family)

    def reference(conversion) -> Optional[Dict[str, torch.Tensor]]:
        measured, info = conversion.measured, conversion.info
        chosen = arch
        if isinstance(chosen, str):
            chosen = spec.canonical_arch(chosen)
        elif chosen is None:
            try:
                chosen = match_arch(spec.name, measured)
            except CheckpointMismatchError:
                if check and config is None:
                    raise
        info['arch'] = chosen
        if config is not None:
            info['config'] = str(config)
        else:
            info['config'] = spec.default_config(chosen, info) if isinstance(chosen, str) else None
        if not check:
            return None
        downstream = info['downstream']
        passthrough = conversion.rest if downstream and not backbone_only else {}
        if config is not None:
            return {**_config_reference(spec, conversion, config, backbone_only), **passthrough}
        expected = {**_prefixed(_reference_backbone_state(spec, conversion, chosen), 'backbone.'), **passthrough}
        if not downstream and not backbone_only:
            expected.update(_classifier_head(spec, conversion.head, measured['embed_dims'][-1], info))
        return expected

    out, conversion = convert_and_check(state, spec.release, reference, f'{spec.name} release checkpoint',
                                        backbone_only=backbone_only, arch_zoo=spec.arch_zoo)
    release = conversion.info['release']
    if release and spec.record:
        out = with_release_record(out, release, spec.record)
    return out, conversion.info


def mmppma_to_release(state: Mapping[str, torch.Tensor], family: str, downstream: bool = False,
                      **options) -> Dict[str, torch.Tensor]:
    """Inverse of :func:`release_to_mmppma` (classification, or downstream with ``downstream=True``): the
    family's release format's ``to_release(state, downstream, **options)``. MLLA: ``img_size``, the size the RoPE
    buffers are regenerated for (default the releases' 224). VMINet: ``revision='7c2632c'`` writes that revision's
    block names (``conv`` for ``dwconv``); the default is the revision the state records
    (:func:`with_release_record`), else '6b11d4a'."""
    return family_of(family).release.to_release(state, downstream, **options)
