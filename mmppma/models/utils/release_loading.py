"""Release checkpoints loaded where a user points at them, converted on load by :func:`release_to_mmppma`.

* A backbone's ``init_cfg=dict(type='Pretrained', checkpoint=PATH_OR_URL[, prefix=...])``: a classification
  release checkpoint (the family's backbone keys at the root, beside the release's head) is converted and its
  backbone part loaded (:func:`load_release_into_backbone`, called by ``StagedBackbone.init_weights``).
* A whole model holding an mmppma backbone (mmpretrain's ``ImageClassifier`` in ``init_model`` / ``get_model``,
  any ``load_state_dict`` or mmengine ``load_checkpoint``): a load-state-dict pre-hook on the backbone's parent
  module converts a release state dict in place before the parent loads it (:func:`install_parent_hook`,
  registered through torch's module-registration hook when ``mmppma`` is imported).

Either way the converted keys are checked against the module that receives them: a missing, unexpected or
mis-shaped key raises :class:`CheckpointMismatchError` naming them. The one exception: loading a
classification checkpoint into a dense-prediction backbone leaves the output norms the release has no
weights for at their initialization, and says so. A report of what was converted is logged (mmengine's
current logger). A checkpoint in mmppma's own layout is not touched.
"""
import functools
from typing import Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn

from .checkpoint_convert import (
    BACKBONE_ROOTS,
    ROPE_SUFFIX,
    VMINET_OLD_CONV,
    CheckpointMismatchError,
    check_state_against,
    extract_state_dict,
    release_to_mmppma,
)

__all__ = ['backbone_family', 'is_release_layout', 'convert_release_state', 'load_release_into_backbone',
           'install_parent_hook']

_HOOKED = '_mmppma_release_hook'


def backbone_family(backbone: nn.Module) -> str:
    """The converter family of an mmppma backbone: 'PPMA' (PPMA and RMT), 'MLLA' or 'VMINet'."""
    from ..backbones import MLLA, PPMA, VMINet
    for cls, family in ((PPMA, 'PPMA'), (MLLA, 'MLLA'), (VMINet, 'VMINet')):
        if isinstance(backbone, cls):
            return family
    raise TypeError(f'{type(backbone).__name__} is not an mmppma backbone (PPMA, RMT, MLLA, VMINet)')


def is_release_layout(state: Mapping[str, torch.Tensor], family: str) -> bool:
    """Whether ``state`` is a classification release state dict of ``family``: the family's backbone keys at
    the root (no ``backbone.`` prefix) with the release's ``head.weight`` (the mmppma classifier has
    ``head.fc.weight``), or release-only buffers (MLLA's RoPE tables, VMINet 7c2632c's block ``conv``)."""
    if not state or any(k.startswith('backbone.') for k in state):
        return False
    if not any(k.startswith(BACKBONE_ROOTS[family]) for k in state):
        return False
    if 'head.weight' in state:
        return True
    if family == 'MLLA':
        return any(k.endswith(ROPE_SUFFIX) for k in state)
    return family == 'VMINet' and any(VMINET_OLD_CONV.match(k) for k in state)


def convert_release_state(state: Mapping[str, torch.Tensor], family: str) -> Tuple[Dict[str, torch.Tensor], dict]:
    """The converter's classifier state (``backbone.*`` and ``head.*``) and info, for a release state dict.
    The converter's own check is left to the caller, which checks against the module actually loaded."""
    converted, info = release_to_mmppma(dict(state), family, check=False)
    stray = sorted(k for k in converted if not k.startswith(('backbone.', 'head.')))
    if stray:
        raise CheckpointMismatchError(f'{family} release checkpoint: {len(stray)} unexpected keys outside its '
                                      f'backbone and head: {stray}')
    return converted, info


def unwrap_state(checkpoint: Mapping) -> Mapping:
    """A release checkpoint file's state dict as mmengine hands it over (the whole file when it has no
    ``state_dict``): the dict under ``model`` (or ``model_ema``, ``models``, ``state_dict_ema``; see
    :func:`extract_state_dict`), else ``checkpoint`` itself."""
    if not any(isinstance(v, Mapping) for v in checkpoint.values()):
        return checkpoint
    try:
        return extract_state_dict(checkpoint)[0]
    except KeyError:
        return checkpoint


def _report(what: str, info: dict, loaded: int, left: List[str], skipped: List[str]) -> str:
    arch = info['arch'] if isinstance(info['arch'], str) else 'custom'
    parts = [f'{what}: converted on load by release_to_mmppma ({info["family"]}-{arch}), {loaded} tensors loaded']
    if info.get('release'):
        parts.append(f'release revision {info["release"]["revision"]}')
    if info['dropped']:
        parts.append(f'{len(info["dropped"])} release buffers dropped (recomputed by mmppma)')
    if skipped:
        parts.append(f'{len(skipped)} classifier tensors (head, final norm) not used by a backbone')
    if left:
        parts.append(f'output norms the classification release has no weights for, left at their '
                     f'initialization: {sorted(left)}')
    parts += info['notes']
    return '; '.join(parts)


def _log(message: str) -> None:
    from mmengine.logging import print_log
    print_log(message, logger='current')


def _check_vminet_record(backbone: nn.Module, info: dict) -> None:
    if info.get('release') and hasattr(backbone, 'check_release_record'):
        backbone.check_release_record(info['release'])


def load_release_into_backbone(backbone: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> dict:
    """Convert a classification release state dict and load its backbone part into ``backbone``.

    Every backbone key of the conversion must be one of the backbone's and every backbone tensor must come
    from it, except the output norms of a dense backbone (``out_indices`` of several stages) the release has
    no weights for; those stay at their initialization and are named in the log. Returns the converter's info.
    """
    family = backbone_family(backbone)
    converted, info = convert_release_state(state, family)
    expected = backbone.state_dict()
    # MLLA / VMINet: the release's final norm becomes backbone.norm{last}, which a dense backbone with
    # LayerNorm outputs (outnorm{i}) does not have: like the head, it then belongs to the classifier only
    final = f'norm{len(backbone.depths) - 1}.'
    keep_final = any(k.startswith(final) for k in expected)
    weights, skipped = {}, []
    for key, value in converted.items():
        name = key[len('backbone.'):] if key.startswith('backbone.') else None
        if name is None or (name.startswith(final) and not keep_final):
            skipped.append(key)
        else:
            weights[name] = value
    norms = {f'{backbone.out_norm_name(i)}.' for i in backbone.out_indices if backbone.out_norm_module(i) is not None}
    left = [k for k in expected if k not in weights and k.startswith(tuple(norms))]
    _check_vminet_record(backbone, info)  # first: its error names the options to set
    check_state_against(weights, {k: v for k, v in expected.items() if k not in left},
                        f'{family} release checkpoint {source} -> {type(backbone).__name__} backbone')
    backbone.load_state_dict(weights, strict=False)
    _log(_report(f'{family} release checkpoint {source} -> {type(backbone).__name__} init_cfg', info, len(weights),
                 left, skipped))
    return info


def read_checkpoint_state(filename: str) -> Dict[str, torch.Tensor]:
    """The state dict of a checkpoint file or URL, read with mmengine's checkpoint loaders (a URL is
    downloaded to, and read from, torch hub's cache)."""
    from mmengine.runner.checkpoint import CheckpointLoader
    checkpoint = CheckpointLoader.load_checkpoint(filename, map_location='cpu', logger='current')
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f'{filename}: a checkpoint must be a dict; got {type(checkpoint).__name__}')
    return extract_state_dict(checkpoint)[0]


def _release_pre_hook(module: nn.Module, state_dict: dict, prefix: str, local_metadata, strict, missing_keys,
                      unexpected_keys, error_msgs, child: str) -> None:
    """Load-state-dict pre-hook of a module whose child ``child`` is an mmppma backbone: a classification
    release state dict under ``prefix`` is replaced, in place, by its conversion, checked against ``module``."""
    backbone = module._modules.get(child)
    if backbone is None:
        return
    family = backbone_family(backbone)
    local = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    release = unwrap_state(local)
    if not is_release_layout(release, family):
        return
    converted, info = convert_release_state(release, family)
    if child != 'backbone':
        converted = {(child + k[len('backbone'):] if k.startswith('backbone.') else k): v for k, v in converted.items()}
    expected = module.state_dict()
    where = f'{family} release checkpoint -> {type(module).__name__}'
    if any(not k.startswith((f'{child}.', 'head.')) for k in expected if k not in converted):
        others = sorted({k.split('.')[0] for k in expected if not k.startswith((f'{child}.', 'head.'))})
        raise CheckpointMismatchError(
            f'{where}: a classification release checkpoint holds only a backbone and a classification head, '
            f'this model also has {others}. Give it to the backbone instead: model.backbone.init_cfg='
            "dict(type='Pretrained', checkpoint=...) (no prefix needed; it is converted on load)")
    _check_vminet_record(backbone, info)  # first: its error names the options to set
    check_state_against(converted, expected, where)
    for k in local:
        del state_dict[prefix + k]
    state_dict.update({prefix + k: v for k, v in converted.items()})
    _log(_report(where, info, len(converted), [], []))


def install_parent_hook(parent: nn.Module, name: str, child: nn.Module) -> None:
    """Module-registration hook: when an mmppma backbone becomes the child ``name`` of ``parent``, give the
    parent the release pre-hook (once per parent and child name)."""
    from ..backbones.base import StagedBackbone
    if not isinstance(child, StagedBackbone):
        return
    hooked = parent.__dict__.setdefault(_HOOKED, set())
    if name in hooked:
        return
    hooked.add(name)
    parent._register_load_state_dict_pre_hook(functools.partial(_release_pre_hook, child=name), with_module=True)


_installed: Optional[object] = None


def register_release_loading() -> None:
    """Install :func:`install_parent_hook` as a torch module-registration hook (once per process)."""
    global _installed
    if _installed is None:
        _installed = torch.nn.modules.module.register_module_module_registration_hook(install_parent_hook)
