"""The VMINet family: the VMINet release's checkpoint format (github.com/yws-wxs/VMINet) and its revisions, as data
for :func:`~mmppma.models.backbones.release.from_release`, and the family's spec (:mod:`.family`). Its timm models and
the model index are the release revision 7c2632c's (``context_mask='tril', proj_norm=False``).

The backbone keeps the release's module names; a classifier's ``norm`` is ``backbone.norm{last}`` and its
``head`` mmpretrain's ``LinearClsHead.fc``. Revision 7c2632c names the blocks' 7x7 ConvBN ``conv`` (ours:
``dwconv``). A converted state records its revision and the options it needs (:data:`RELEASE_RECORD`,
:func:`~.release.with_release_record`).
"""
import math
import re
import sys
from typing import Dict, Mapping, Optional

import torch

from .family import FamilySpec, Variant, register_family
from .release import (
    CheckpointMismatchError,
    block_indices,
    linear_head,
    linear_head_to_release,
    out_norm_indices,
    prefixed,
    stage_count,
)
from .vminet import RELEASE_RECORD, VMINet

FAMILY = 'VMINet'
ROOTS = ('stem.', 'stages.')
ARCH_NAMES = ('ti', 'xs', 's', 'b')
#: settings of the arch table that the weights do not show, with the releases' values
IMPLIED = {'stem_channels': 32, 'kernel_size': 7}
HEAD_IN_BACKBONE = True  # the release's final norm is the backbone's norm{last}
OLD_CONV = re.compile(r'^(stages\.\d+\.[1-9]\d*\.)conv\.')  # revision 7c2632c: block's 7x7 ConvBN
NEW_CONV = re.compile(r'^(stages\.\d+\.[1-9]\d*\.)dwconv\.')

#: The public release's revisions of ``vminet.py`` -> the backbone options reproducing each.
RELEASE_REVISIONS: Dict[str, dict] = {
    '6b11d4a': dict(context_mask='none', proj_norm=True),  # blocks' ``dwconv``, BatchNorm after ``g``, no mask
    '7c2632c': dict(context_mask='tril', proj_norm=False),  # blocks' ``conv``, no BatchNorm after ``g``, mask
}


def measure(backbone: Mapping[str, torch.Tensor]) -> dict:
    """The settings visible in a VMINet backbone state dict: embed_dims, depths, mlp_ratios, stem_channels,
    kernel_size, the name of the blocks' 7x7 ConvBN (``block_conv``: 'dwconv', or 'conv' as the release revision
    7c2632c), ``proj_norm`` (``g.bn`` present), the stage-0 token table side ``base_size``, the dense output
    norms ``out_norms`` and the backbone's ``out_norm`` they need (``norm{i}``: 'BN', ``outnorm{i}``: 'LN')."""
    if 'stem.0.conv.weight' not in backbone:
        raise CheckpointMismatchError('not a VMINet backbone: no stem.0.conv.weight; keys start with '
                                      f'{sorted(backbone)[:5]}')
    conv = 'conv' if any(OLD_CONV.match(k) for k in backbone) else 'dwconv'
    dims, depths = [], []
    for s in range(stage_count(backbone, 'stages')):
        key = f'stages.{s}.0.conv.weight'
        if key not in backbone:
            raise CheckpointMismatchError(f'VMINet backbone: stage {s} has no downsample {key}')
        dims.append(backbone[key].shape[0])
        blocks = block_indices(backbone, rf'stages\.{s}\.(\d+)\.')
        depths.append(blocks[-1] if blocks else 0)
    first = 'stages.0.1.'
    if first + 'f1.conv.weight' not in backbone:
        raise CheckpointMismatchError(f'VMINet backbone: no {first}f1.conv.weight')
    table = backbone[first + 'sum.weight'].shape[-1] if first + 'sum.weight' in backbone else 0
    bn, ln = out_norm_indices(backbone, 'norm'), out_norm_indices(backbone, 'outnorm')
    return dict(
        embed_dims=dims,
        depths=depths,
        mlp_ratios=[backbone[f'stages.{s}.1.f1.conv.weight'].shape[0] // d if f'stages.{s}.1.f1.conv.weight' in
                    backbone else None for s, d in enumerate(dims)],
        stem_channels=backbone['stem.0.conv.weight'].shape[0],
        kernel_size=backbone[f'{first}{conv}.conv.weight'].shape[-1] if f'{first}{conv}.conv.weight' in backbone
        else None,
        block_conv=conv,
        proj_norm=any(k.endswith('.g.bn.weight') for k in backbone),
        base_size=math.isqrt(table),
        out_norms=bn or ln,
        out_norm='BN' if bn else ('LN' if ln else None))


def revision(measured: dict, downstream: bool) -> Optional[str]:
    """The release revision of a VMINet state dict's block layout (:func:`inspect`): 7c2632c (``conv``, no
    ``g.bn``), 6b11d4a (``dwconv``, ``g.bn``; for a classification state), None (a downstream state in
    mmppma's ``dwconv`` layout: its options are not visible in the keys). Any other mix is an error."""
    old = measured['block_conv'] == 'conv'
    if old != (not measured['proj_norm']) and (old or not downstream):
        raise CheckpointMismatchError(
            f"VMINet blocks named {'conv' if old else 'dwconv'} {'with' if measured['proj_norm'] else 'without'} "
            f"g.bn: neither release revision's layout (6b11d4a: dwconv with g.bn; 7c2632c: conv without)")
    if old:
        return '7c2632c'
    return None if downstream else '6b11d4a'


def map_backbone(backbone: dict, measured: dict, downstream: bool, info: dict) -> dict:
    """The identity but 7c2632c's block ``conv`` (-> ``dwconv``); records the revision, its options
    (``info['release']``) and the overrides the state needs (``proj_norm``, ``img_size``)."""
    found = revision(measured, downstream)
    if measured['block_conv'] == 'conv':
        backbone = {OLD_CONV.sub(r'\1dwconv.', k): v for k, v in backbone.items()}
        info['notes'].append("blocks' conv.* renamed dwconv.*")
    if found is None:
        info['notes'].append("a backbone.-prefixed state in mmppma's layout: no release revision, its context mask "
                             'is not visible in the weights')
        if not measured['proj_norm']:
            info['backbone_overrides']['proj_norm'] = False
    if measured['base_size'] and measured['base_size'] != 56:
        info['backbone_overrides']['img_size'] = measured['base_size'] * 4
    info['release'] = dict(revision=found, **RELEASE_REVISIONS[found]) if found else None
    info['revision'] = found
    return backbone


map_head = linear_head


def release_only(state: Mapping[str, torch.Tensor]) -> bool:
    """Revision 7c2632c's block ``conv``."""
    return any(OLD_CONV.match(k) for k in state)


def to_release(state: Mapping[str, torch.Tensor], downstream: bool = False,
               revision: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """mmppma keys -> the release's. ``revision='7c2632c'`` writes that revision's block names (``conv`` for
    ``dwconv``); the default is the revision the state records (:data:`RELEASE_RECORD`), else '6b11d4a'."""
    backbone = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    others = {k: v for k, v in state.items() if not k.startswith('backbone.')}
    if revision is None:
        record = (getattr(state, '_metadata', None) or {}).get('backbone', {}).get(RELEASE_RECORD)
        revision = record['revision'] if record else '6b11d4a'
    if revision == '7c2632c':
        backbone = {NEW_CONV.sub(r'\1conv.', k): v for k, v in backbone.items()}
    elif revision != '6b11d4a':
        raise ValueError(f"revision={revision!r}; choose '6b11d4a' or '7c2632c'")
    if downstream:
        return {**prefixed(backbone, 'backbone.'), **others}
    return linear_head_to_release(backbone, others, stage_count(backbone, 'stages'))


def weight_options(conversion) -> dict:
    """The options of the release revision the keys show; for a state in mmppma's layout (no revision), the
    ``proj_norm`` its keys show (its context mask is not visible in the weights)."""
    release = conversion.info['release']
    if release is None:
        return dict(proj_norm=conversion.measured['proj_norm'])
    return {k: v for k, v in release.items() if k != 'revision'}


SPEC = register_family(FamilySpec(
    release=sys.modules[__name__],
    variants=(Variant('VMINet', VMINet, options=dict(RELEASE_REVISIONS['7c2632c']), metafile='vminet',
                      code='https://github.com/yws-wxs/VMINet',
                      no_weights='the VMINet release publishes no VMINet-B weights (its README says "retraining")'), ),
    sizes=dict(tiny='ti', xsmall='xs', small='s', base='b'),
    head='linear',
    stem='stem.0.conv',
    classifier_options=dict(out_norm='BN'),  # the release's final norm is norm3
    dense_options=dict(out_norm='LN'),
    weight_options=weight_options,
    revision_config='configs/vminet_{arch}_release-{revision}_in1k.py',
    record=RELEASE_RECORD,
))
