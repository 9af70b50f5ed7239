"""Whole release detectors and segmentors -> checkpoints of mmppma's mmdet 3 / mmseg 1 configs.

The PPMA release trains Mask R-CNN with mmdet 2.x and UPerNet with mmseg 0.x. Their checkpoints hold
``{'meta': {'CLASSES': ..., 'PALETTE': ...}, 'state_dict': ...}`` with the backbone under ``backbone.``
(converted by :func:`release_to_mmppma`) and the neck and heads under mmdet's / mmseg's own module names, which
mmdet 3 and mmseg 1 kept for these models (FPN ``neck.{lateral,fpn}_convs``, ``rpn_head.rpn_{conv,cls,reg}``,
``roi_head.bbox_head.{shared_fcs,fc_cls,fc_reg}``, ``roi_head.mask_head.{convs,upsample,conv_logits}``;
UPerHead ``decode_head.{psp_modules,bottleneck,lateral_convs,fpn_convs,fpn_bottleneck,conv_seg}``, FCNHead
``auxiliary_head.{convs,conv_seg}``). What changed is the meta: mmdet 3 / mmseg 1 read the class names from
``meta['dataset_meta']``. :func:`convert_whole_release` converts the backbone, checks every key and shape of
the result once, against the model the config builds (on the meta device: no memory), and rewrites the meta.
"""
from pathlib import Path
from typing import Dict, Mapping, Tuple, Union

from ..backbones.release import CheckpointMismatchError, check_keys, extract_state_dict
from .checkpoint_convert import release_to_mmppma

#: release meta keys -> ``dataset_meta`` keys of mmdet 3 / mmseg 1
META_KEYS = {'CLASSES': 'classes', 'PALETTE': 'palette'}


def dataset_meta(meta: Mapping) -> Dict[str, object]:
    """``dataset_meta`` from a release checkpoint's meta (mmdet 2 / mmseg 0.x ``CLASSES``, ``PALETTE``)."""
    found = dict(meta.get('dataset_meta') or {})
    for old, new in META_KEYS.items():
        if meta.get(old) is not None:
            found[new] = list(meta[old]) if not isinstance(meta[old], str) else meta[old]
    return found


def convert_whole_release(checkpoint: Mapping, family: str, config: Union[str, Path]) -> Tuple[dict, dict]:
    """A release detector / segmentor checkpoint -> ``({'meta': {'dataset_meta': ...}, 'state_dict': ...},
    info)`` for the model of ``config`` (e.g. ``configs/mask_rcnn_ppma_t_1x_coco.py``).

    Every key of the release state dict is consumed: the converted state must have exactly the model's keys
    and shapes, else :class:`CheckpointMismatchError` lists the missing, unexpected and mis-shaped ones.
    """
    state, _ = extract_state_dict(checkpoint)
    converted, info = release_to_mmppma(state, family, check=False)  # checked below, with the detector's keys
    if not info['downstream']:
        raise CheckpointMismatchError(f'not a detector / segmentor checkpoint: no backbone.* keys (a {family} '
                                      f'classification checkpoint converts without --model-config)')
    from mmppma.utils.configs import build_config_model
    model = build_config_model(config, device='meta')
    expected = model.state_dict()
    check_keys(converted, expected, f'{info["family"]} release model -> {type(model).__name__} of {config}')
    meta = dataset_meta(checkpoint.get('meta') or {})
    info['model'] = type(model).__name__
    info['config'] = str(config)
    info['dataset_meta'] = sorted(meta)
    return dict(meta=dict(dataset_meta=meta), state_dict=converted), info
