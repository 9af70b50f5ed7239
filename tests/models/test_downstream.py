"""The backbones inside upstream models built from upstream configs (mmdet, mmseg) and our in1k configs
(mmpretrain), on CPU with tiny inputs."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from .conftest import SMALL_ARCH

REPO = Path(__file__).resolve().parents[2]
DIMS = SMALL_ARCH['embed_dims']
# the PPMA/RMT recipe; other families (MLLA, VMINet) carry their own config tests
IN1K_CONFIGS = sorted(p for f in ('ppma', 'rmt') for p in (REPO / 'configs').glob(f'{f}_*_in1k.py'))


def test_bare_and_prefixed_names_build_in_every_scope(mmdet_ready, mmseg_ready):
    from mmdet.registry import MODELS as DET
    from mmseg.registry import MODELS as SEG

    import mmppma  # noqa: F401  (registers the bare names)
    for registry in (DET, SEG):
        for name in ('PPMA', 'mmppma.PPMA', 'RMT', 'mmppma.RMT'):
            model = registry.build(dict(type=name, arch=SMALL_ARCH, out_indices=(3, ))).eval()
            assert model(torch.randn(1, 3, 32, 32))[0].shape == (1, 64, 1, 1)


def test_mmdet_mask_rcnn_losses(mmdet_ready):
    import numpy as np
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.registry import init_default_scope
    from mmengine.structures import InstanceData
    cfg = Config.fromstring(
        f"""
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
model = dict(
    backbone=dict(_delete_=True, type='mmppma.PPMA', arch={SMALL_ARCH!r}, frozen_stages=1, norm_eval=True),
    neck=dict(in_channels={DIMS!r}, out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32), bbox_head=dict(in_channels=32, fc_out_channels=64),
        mask_roi_extractor=dict(out_channels=32), mask_head=dict(in_channels=32, conv_out_channels=32)))
""", file_format='.py')
    init_default_scope('mmdet')
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
    assert model.backbone.layers[1].blocks[0].ffn.fc1.weight.grad is not None
    assert model.backbone.layers[0].blocks[0].ffn.fc1.weight.grad is None  # frozen_stages=1


def test_mmseg_upernet_forward(mmseg_ready):
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = Config.fromstring(
        f"""
_base_ = 'mmseg::_base_/models/upernet_swin.py'
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    backbone=dict(_delete_=True, type='mmppma.RMT', arch={SMALL_ARCH!r}, out_indices=(0, 1, 2, 3)),
    decode_head=dict(in_channels={DIMS!r}, channels=32, num_classes=5, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels={DIMS[2]}, channels=16, num_classes=5, norm_cfg=norm_cfg))
""", file_format='.py')
    init_default_scope('mmseg')
    model = MODELS.build(cfg.model).eval()
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 50, 70), mode='tensor')
    assert logits.shape == (1, 5, 13, 18)  # UPerHead predicts at the stride-4 map


@pytest.mark.parametrize('path', IN1K_CONFIGS, ids=lambda p: p.name)
def test_in1k_config_contents(path):
    """Every in1k config carries the release recipe (docs/method.md §9) through the shared base."""
    cfg = Config.fromfile(str(path))
    family, size = path.name.split('_')[:2]
    assert cfg.default_scope == 'mmpretrain'
    assert cfg.model.backbone.type == f'mmppma.{family.upper()}'
    assert cfg.model.backbone.arch == {'t': 'tiny', 's': 'small', 'b': 'base'}[size]
    assert cfg.model.backbone.drop_path_rate == {'t': 0.1, 's': 0.15, 'b': 0.4}[size]
    assert cfg.model.head.type == 'mmppma.PPMAClsHead' and cfg.model.head.num_classes == 1000
    opt = cfg.optim_wrapper
    assert opt.type == 'AmpOptimWrapper'
    assert (opt.optimizer.type, opt.optimizer.lr, opt.optimizer.weight_decay) == ('AdamW', 1e-3, 0.05)
    assert set(opt.paramwise_cfg.no_decay_names) == {'A_log', 'dt_bias'}
    assert cfg.auto_scale_lr.base_batch_size == 1024
    assert cfg.train_dataloader.batch_size == 128 and cfg.train_dataloader.sampler.type == 'RepeatAugSampler'
    warmup, cosine = cfg.param_scheduler
    assert (warmup.type, warmup.end, cosine.type, cosine.eta_min) == ('LinearLR', 5, 'CosineAnnealingLR', 1e-5)
    assert cfg.train_cfg.max_epochs == 300
    assert [a.alpha for a in cfg.model.train_cfg.augments] == [0.8, 1.0]
    assert cfg.model.head.loss.label_smooth_val == 0.1
    pipeline = {t.type: t for t in cfg.train_dataloader.dataset.pipeline}
    assert pipeline['RandAugment'].magnitude_level == 9 and pipeline['RandomErasing'].erase_prob == 0.25
    assert any(h.type == 'EMAHook' for h in cfg.custom_hooks)


def test_in1k_config_builds_and_trains_one_step(mmpretrain_ready):
    """PPMA-T from its config with overrides: loss (mixup/cutmix soft targets), backward, predict."""
    from mmpretrain.apis import get_model
    from mmpretrain.structures import DataSample
    cfg = Config.fromfile(str(REPO / 'configs' / 'ppma_t_8xb128_in1k.py'))
    cfg.model.backbone.arch = SMALL_ARCH
    cfg.model.head.in_channels = DIMS[-1]
    cfg.model.head.num_classes = 10
    cfg.model.data_preprocessor = dict(cfg.data_preprocessor, num_classes=10)
    model = get_model(cfg)
    model.train()
    inputs = [torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8) for _ in range(2)]
    samples = [DataSample().set_gt_label(3), DataSample().set_gt_label(7)]
    data = model.data_preprocessor(dict(inputs=inputs, data_samples=samples), training=True)
    losses = model(**data, mode='loss')
    losses['loss'].backward()
    assert torch.isfinite(losses['loss'])
    model.eval()
    data = model.data_preprocessor(dict(inputs=inputs, data_samples=samples), training=False)
    preds = model(**data, mode='predict')
    assert preds[0].pred_score.shape == (10, )


def test_init_model_loads_converted_release_checkpoint(tmp_path, mmpretrain_ready):
    """Release-layout state (from the fixture key list) -> converter CLI -> mmpretrain init_model, strict."""
    from mmpretrain.apis import init_model

    from tests.conftest import release_state
    state = release_state('ppma_T', random=True)
    torch.save({'model': state}, tmp_path / 'official.pth')
    subprocess.run([sys.executable, str(REPO / 'tools/model_converters/ppma_official_to_mmppma.py'),
                    str(tmp_path / 'official.pth'), str(tmp_path / 'mmppma.pth')], check=True, capture_output=True)
    model = init_model(str(REPO / 'configs' / 'ppma_t_8xb128_in1k.py'), str(tmp_path / 'mmppma.pth'))
    converted = torch.load(tmp_path / 'mmppma.pth')['state_dict']
    result = model.load_state_dict(converted, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    torch.testing.assert_close(model.head.fc.weight, state['head.weight'])
    torch.testing.assert_close(model.backbone.layers[2].blocks[7].retention.path_embed.A_log,
                               state['layers.2.blocks.7.retention.path_embed.A_log'])
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 48, 40), mode='tensor').shape == (1, 1000)
