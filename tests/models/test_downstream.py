"""Each backbone family, small, in the upstream models its shipped configs build (ImageClassifier, Mask R-CNN,
UPerNet) on tiny inputs; PPMA in upstream mmseg configs for other backbones with only the channels changed."""
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from .conftest import FAMILIES, SMALL_ARCH

CONFIGS = Path(__file__).resolve().parents[2] / 'configs'


def small_config(name: str, kind: str) -> Config:
    """The family's tiny config of ``kind`` ('cls' | 'det' | 'seg') with the family's small arch."""
    family, size = name.lower(), 'ti' if name == 'VMINet' else 't'
    path = {'cls': f'{family}_{size}_8xb128_in1k.py', 'det': f'mask_rcnn_{family}_{size}_1x_coco.py',
            'seg': f'upernet_{family}_{size}_512x512_160k_ade20k.py'}[kind]
    cfg = Config.fromfile(str(CONFIGS / path))
    cfg.model.backbone.arch = FAMILIES[name].arch
    cfg.model.backbone.init_cfg = None
    return cfg


def dims(name: str) -> list:
    return FAMILIES[name].arch['embed_dims']


@pytest.mark.parametrize('name', FAMILIES)
def test_classifier_from_config_trains_and_predicts(name, mmpretrain_ready):
    """Loss with the recipe's mixup / cutmix soft targets, backward, predict."""
    from mmpretrain.apis import get_model
    from mmpretrain.structures import DataSample
    cfg = small_config(name, 'cls')
    cfg.model.head.update(in_channels=dims(name)[-1], num_classes=10)
    cfg.model.data_preprocessor = dict(cfg.data_preprocessor, num_classes=10)
    model = get_model(cfg).train()
    inputs = [torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8) for _ in range(2)]
    samples = [DataSample().set_gt_label(3), DataSample().set_gt_label(7)]
    data = model.data_preprocessor(dict(inputs=inputs, data_samples=samples), training=True)
    loss = model(**data, mode='loss')['loss']
    loss.backward()
    assert torch.isfinite(loss)
    data = model.eval().data_preprocessor(dict(inputs=inputs, data_samples=samples), training=False)
    assert model(**data, mode='predict')[0].pred_score.shape == (10, )


@pytest.mark.parametrize('name', FAMILIES)
def test_mask_rcnn_from_config_losses(name, mmdet_ready):
    """All four loss groups, back-propagated; frozen_stages=1 leaves stage 0 without gradients."""
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    cfg = small_config(name, 'det')
    cfg.model.backbone.frozen_stages = 1
    narrow = ('neck.out_channels', 'rpn_head.in_channels', 'rpn_head.feat_channels', 'roi_head.bbox_head.in_channels',
              'roi_head.bbox_roi_extractor.out_channels', 'roi_head.mask_roi_extractor.out_channels',
              'roi_head.mask_head.in_channels', 'roi_head.mask_head.conv_out_channels')  # narrower heads: faster
    cfg.merge_from_dict({'model.neck.in_channels': dims(name), 'model.roi_head.bbox_head.fc_out_channels': 64,
                         **{f'model.{k}': 32 for k in narrow}})
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    sample = DetDataSample(metainfo=dict(img_shape=(64, 96), pad_shape=(64, 96), ori_shape=(64, 96),
                                         scale_factor=(1.0, 1.0), batch_input_shape=(64, 96)))
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor([[5.0, 5.0, 40.0, 50.0]]), labels=torch.tensor([1]),
        masks=BitmapMasks(np.zeros((1, 64, 96), dtype=np.uint8), 64, 96))
    losses = model(torch.randn(1, 3, 64, 96), [sample], mode='loss')
    assert {'loss_rpn_cls', 'loss_cls', 'loss_bbox', 'loss_mask'} <= set(losses)
    total = sum(v.sum() if torch.is_tensor(v) else sum(x.sum() for x in v) for k, v in losses.items() if 'loss' in k)
    total.backward()
    stages = getattr(model.backbone, model.backbone.stages_name)
    assert all(p.grad is None for p in stages[0].parameters())
    assert all(p.grad is not None for p in stages[1].blocks[0].parameters())


@pytest.mark.parametrize('name', FAMILIES)
def test_upernet_from_config_forward(name, mmseg_ready):
    from mmseg.registry import MODELS
    cfg = small_config(name, 'seg')
    norm_cfg = dict(type='BN', requires_grad=True)
    cfg.model.decode_head.update(in_channels=dims(name), channels=16, num_classes=5, norm_cfg=norm_cfg)
    cfg.model.auxiliary_head.update(in_channels=dims(name)[2], channels=8, num_classes=5, norm_cfg=norm_cfg)
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model).eval()
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 50, 70), mode='tensor')
    assert logits.shape == (1, 5, 13, 18)  # UPerHead predicts at the stride-4 map


def swapped(base: str, heads: str) -> Config:
    """``base`` (an mmseg:: config) with the backbone replaced by a small PPMA; ``heads`` sets channel lists."""
    return Config.fromstring(f"""
_base_ = '{base}'
model = dict(
    backbone=dict(_delete_=True, type='mmppma.PPMA', arch={SMALL_ARCH!r}, out_indices=(0, 1, 2, 3)),
{heads})
""", file_format='.py')


def check_trains(cfg: Config) -> None:
    """Losses on two synthetic 64 x 64 images, finite and back-propagated to the first and last stage."""
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    samples = []
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(64, 64), pad_shape=(64, 64), ori_shape=(64, 64)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, 64, 64)))
        samples.append(sample)
    losses = model(torch.randn(2, 3, 64, 64), samples, mode='loss')
    total = sum(v for k, v in losses.items() if k.startswith('loss') or '.loss' in k)
    assert torch.isfinite(total)
    total.backward()
    assert model.backbone.layers[0].blocks[0].retention.q_proj.weight.grad is not None
    assert model.backbone.layers[3].blocks[0].retention.path_embed.A_log.grad is not None


def test_mmseg_deeplabv3plus_config_with_ppma(mmseg_ready):
    d = SMALL_ARCH['embed_dims']

    def config() -> Config:
        return swapped('mmseg::deeplabv3plus/deeplabv3plus_r50-d8_4xb4-80k_ade20k-512x512.py',
                       f'    decode_head=dict(in_channels={d[3]}, c1_in_channels={d[0]}),\n'
                       f'    auxiliary_head=dict(in_channels={d[2]}),')

    cfg = config()
    assert cfg.model.pretrained == 'open-mmlab://resnet50_v1c'  # what the upstream config asks for
    with pytest.raises(ValueError, match='model.pretrained=None'):
        check_trains(cfg)
    cfg = config()  # EncoderDecoder wrote pretrained into the backbone's config while building
    cfg.model.pretrained = None  # as the message says
    check_trains(cfg)


def test_mmseg_segformer_config_with_ppma(mmseg_ready):
    check_trains(swapped('mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py',
                         f'    decode_head=dict(in_channels={SMALL_ARCH["embed_dims"]!r}),'))
