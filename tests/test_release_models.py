"""Whole release models: the PPMA release's Mask R-CNN (mmdet 2.x) and UPerNet (mmseg 0.x) checkpoints converted
into the layout of ``configs/mask_rcnn_ppma_t_1x_coco.py`` (mmdet 3) and ``configs/upernet_ppma_t_*`` (mmseg 1),
every key consumed and loaded strictly.

The release state dicts are written here from the release configs' settings and mmdet 2 / mmseg 0.x's module
names (not from mmdet 3 / mmseg 1 models): the PPMA-T backbone's release keys (``tests/fixtures``) with the
dense output norms ``outnorm{i}`` of the release's ``detection/ppma.py``, then FPN + RPN + Shared2FC bbox head
+ FCN mask head (mmdet 2's ``mask_rcnn_r50_fpn``), or UPerHead + FCN auxiliary head (mmseg 0.x's
``upernet_r50``), with random tensors.
"""
from pathlib import Path
from typing import Dict, Tuple

import pytest
import torch

from mmppma.models.utils import CheckpointMismatchError

from .conftest import fixture_shapes
from .test_model_zoo import random_tensors

REPO = Path(__file__).resolve().parents[1]
DIMS = (64, 128, 256, 512)  # PPMA-T
COCO_CLASSES = 80
ADE_CLASSES = 150
Shapes = Dict[str, Tuple[int, ...]]


def backbone_shapes() -> Shapes:
    """The release's dense PPMA-T backbone: its classification keys without the head, and LayerNorm outnorm{i}."""
    shapes = {f'backbone.{k}': v for k, v in fixture_shapes('ppma_T').items()
              if not k.startswith(('proj.', 'norm.', 'head.'))}
    for i, dim in enumerate(DIMS):
        shapes.update({f'backbone.outnorm{i}.weight': (dim, ), f'backbone.outnorm{i}.bias': (dim, )})
    return shapes


def conv(name: str, out: int, inp: int, k: int, bias: bool = True) -> Shapes:
    shapes = {f'{name}.weight': (out, inp, k, k)}
    if bias:
        shapes[f'{name}.bias'] = (out, )
    return shapes


def conv_module(name: str, out: int, inp: int, k: int, bn: bool) -> Shapes:
    """mmcv's ConvModule: ``conv`` (no bias under a norm) and ``bn`` with its statistics."""
    shapes = conv(f'{name}.conv', out, inp, k, bias=not bn)
    if bn:
        shapes.update({f'{name}.bn.{p}': (out, ) for p in ('weight', 'bias', 'running_mean', 'running_var')})
        shapes[f'{name}.bn.num_batches_tracked'] = ()
    return shapes


def mask_rcnn_head_shapes() -> Shapes:
    """mmdet 2.x mask_rcnn_r50_fpn: FPN(256, 5 outs), RPNHead (3 anchors), Shared2FCBBoxHead, FCNMaskHead."""
    shapes = {}
    for i, dim in enumerate(DIMS):
        shapes.update(conv_module(f'neck.lateral_convs.{i}', 256, dim, 1, bn=False))
        shapes.update(conv_module(f'neck.fpn_convs.{i}', 256, 256, 3, bn=False))
    shapes.update(conv('rpn_head.rpn_conv', 256, 256, 3))
    shapes.update(conv('rpn_head.rpn_cls', 3, 256, 1))
    shapes.update(conv('rpn_head.rpn_reg', 12, 256, 1))
    bbox = 'roi_head.bbox_head'
    shapes.update({f'{bbox}.fc_cls.weight': (COCO_CLASSES + 1, 1024), f'{bbox}.fc_cls.bias': (COCO_CLASSES + 1, ),
                   f'{bbox}.fc_reg.weight': (4 * COCO_CLASSES, 1024), f'{bbox}.fc_reg.bias': (4 * COCO_CLASSES, ),
                   f'{bbox}.shared_fcs.0.weight': (1024, 256 * 7 * 7), f'{bbox}.shared_fcs.0.bias': (1024, ),
                   f'{bbox}.shared_fcs.1.weight': (1024, 1024), f'{bbox}.shared_fcs.1.bias': (1024, )})
    for i in range(4):
        shapes.update(conv_module(f'roi_head.mask_head.convs.{i}', 256, 256, 3, bn=False))
    shapes.update({'roi_head.mask_head.upsample.weight': (256, 256, 2, 2), 'roi_head.mask_head.upsample.bias': (256, )})
    shapes.update(conv('roi_head.mask_head.conv_logits', COCO_CLASSES, 256, 1))
    return shapes


def upernet_head_shapes() -> Shapes:
    """mmseg 0.x upernet_r50: UPerHead (channels 512, pool scales 1, 2, 3, 6; SyncBN) and FCNHead on stage 2
    (channels 256, one conv), 150 classes."""
    head, channels = 'decode_head', 512
    shapes = conv(f'{head}.conv_seg', ADE_CLASSES, channels, 1)
    for j in range(4):
        shapes.update(conv_module(f'{head}.psp_modules.{j}.1', channels, DIMS[-1], 1, bn=True))
    shapes.update(conv_module(f'{head}.bottleneck', channels, DIMS[-1] + 4 * channels, 3, bn=True))
    for i, dim in enumerate(DIMS[:-1]):
        shapes.update(conv_module(f'{head}.lateral_convs.{i}', channels, dim, 1, bn=True))
        shapes.update(conv_module(f'{head}.fpn_convs.{i}', channels, channels, 3, bn=True))
    shapes.update(conv_module(f'{head}.fpn_bottleneck', channels, 4 * channels, 3, bn=True))
    shapes.update(conv_module('auxiliary_head.convs.0', 256, DIMS[2], 3, bn=True))
    shapes.update(conv('auxiliary_head.conv_seg', ADE_CLASSES, 256, 1))
    return shapes


TASKS = {
    'det': dict(library='mmdet.models', config='configs/mask_rcnn_ppma_t_1x_coco.py', heads=mask_rcnn_head_shapes,
                meta=dict(CLASSES=tuple(f'class{i}' for i in range(COCO_CLASSES)), mmdet_version='2.28.2')),
    'seg': dict(library='mmseg.models', config='configs/upernet_ppma_t_512x512_160k_ade20k.py',
                heads=upernet_head_shapes,
                meta=dict(CLASSES=tuple(f'class{i}' for i in range(ADE_CLASSES)),
                          PALETTE=[[i, i, i] for i in range(ADE_CLASSES)], mmseg_version='0.30.0')),
}


def release_checkpoint(task: str) -> dict:
    state = random_tensors({**backbone_shapes(), **TASKS[task]['heads']()})
    return dict(meta=dict(TASKS[task]['meta']), state_dict=state, optimizer={})


@pytest.fixture(params=list(TASKS))
def task(request) -> str:
    pytest.importorskip(TASKS[request.param]['library'])
    return request.param


def test_whole_release_model_converts_and_loads_strictly(task, tmp_path, converter_main):
    """The command line: every key of the release file in the config's model, loaded with strict checking into
    the model built by mmdet 3 / mmseg 1, each tensor the release's."""
    from mmppma.models.utils.whole_model_convert import build_config_model
    release = release_checkpoint(task)
    src, dst = tmp_path / 'release.pth', tmp_path / 'converted.pth'
    torch.save(release, src)
    config = str(REPO / TASKS[task]['config'])
    assert converter_main(['--family', 'PPMA', str(src), str(dst), '--model-config', config]) == 0
    converted = torch.load(dst, map_location='cpu', weights_only=True)
    model = build_config_model(config, device='cpu')
    model.load_state_dict(converted['state_dict'], strict=True)
    got = model.state_dict()
    assert set(got) == set(release['state_dict'])
    for key, value in release['state_dict'].items():
        assert torch.equal(got[key], value), key
    assert converted['meta']['dataset_meta']['classes'] == list(TASKS[task]['meta']['CLASSES'])


def test_whole_release_model_names_wrong_keys(task):
    from mmppma.models.utils.whole_model_convert import convert_whole_release
    edit = {'det': 'missing', 'seg': 'unexpected'}[task]
    release = release_checkpoint(task)
    state = release['state_dict']
    key = sorted(k for k in state if not k.startswith('backbone.'))[0]
    if edit == 'missing':
        del state[key]
    else:
        key = key.rsplit('.', 1)[0] + '.extra'
        state[key] = torch.zeros(1)
    config = REPO / TASKS[task]['config']
    with pytest.raises(CheckpointMismatchError, match=f'1 {edit} keys .*{key.replace(".", "[.]")}'):
        convert_whole_release(release, 'PPMA', config)
