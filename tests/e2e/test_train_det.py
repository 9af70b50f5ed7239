"""Mask R-CNN end to end on the tiny COCO set: our config through the real launchers (train, resume,
test), and upstream's own Mask R-CNN config with only the backbone swapped."""
import pickle

import pytest
import torch
from mmengine.config import Config

import mmppma  # noqa: F401  (allowlists mmengine checkpoint globals for torch.load(weights_only=True))

from .conftest import TINY_DET, TOOLS, run_tool, scalar_records, train_iters

pytestmark = pytest.mark.slow

# untrained heads score below mmdet's 0.05 threshold: keep every box so CocoMetric has results to score
KEEP_ALL = ['model.test_cfg.rcnn.score_thr=0.0']


@pytest.fixture(autouse=True)
def _mmdet():
    pytest.importorskip('mmdet.models')


def test_train_resume_test_through_the_launchers(tiny_env, tmp_path):
    work = tmp_path / 'work'
    common = ['default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1', *KEEP_ALL]

    first = run_tool([TOOLS / 'train.py', TINY_DET, '--work-dir', work, '--cfg-options', 'train_cfg.max_iters=2',
                      'train_cfg.val_interval=2', *common], tiny_env)
    assert train_iters(first.stdout + first.stderr) == [1, 2]
    assert (work / 'iter_2.pth').is_file()
    metrics = [r for r in scalar_records(work) if 'coco/bbox_mAP' in r]
    assert len(metrics) == 1
    for key in ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50'):
        assert isinstance(metrics[0][key], float) and 0.0 <= metrics[0][key] <= 1.0, key

    # --resume without a path: the latest checkpoint of the work dir; the iteration counter goes on at 3
    second = run_tool([TOOLS / 'train.py', TINY_DET, '--work-dir', work, '--resume', '--cfg-options',
                       'train_cfg.max_iters=4', 'train_cfg.val_interval=100', *common], tiny_env)
    log = second.stdout + second.stderr
    assert 'resumed' in log.lower()
    assert train_iters(log) == [3, 4]
    state = torch.load(work / 'iter_4.pth', map_location='cpu', weights_only=True)
    assert state['meta']['iter'] == 4
    before = torch.load(work / 'iter_2.pth', map_location='cpu', weights_only=True)['state_dict']
    key = 'backbone.layers.2.blocks.0.retention.path_embed.A_log'
    assert not torch.equal(before[key], state['state_dict'][key])  # the resumed run trained the decays

    out = tmp_path / 'preds.pkl'
    test = run_tool([TOOLS / 'test.py', TINY_DET, work / 'iter_4.pth', '--work-dir', tmp_path / 'test', '--out', out,
                     '--cfg-options', *KEEP_ALL], tiny_env)
    assert 'coco/segm_mAP' in test.stdout + test.stderr
    with open(out, 'rb') as f:
        preds = pickle.load(f)
    assert len(preds) == 6 and {'bboxes', 'labels', 'masks', 'scores'} <= set(preds[0]['pred_instances'])


@pytest.mark.heavy  # a PPMA-T step at the upstream pipeline's full image size
def test_upstream_mask_rcnn_config_with_ppma_backbone_trains_a_step(tiny_data, tmp_path):
    """mmdet's own mask-rcnn_r50_fpn_1x_coco.py, backbone -> PPMA-T and FPN in_channels; data pointed at the
    tiny set (its class names, batch 1, no workers); its 1333x800 pipeline and heads as they are."""
    from mmengine.runner import Runner

    from mmppma.utils import register_scope_modules
    cfg = Config.fromstring(
        """
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
model = dict(
    backbone=dict(_delete_=True, type='mmppma.PPMA', arch='tiny', out_indices=(0, 1, 2, 3)),
    neck=dict(in_channels=[64, 128, 256, 512]))
""", file_format='.py')
    cfg.train_dataloader.update(batch_size=1, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.update(
        data_root=str(tiny_data / 'coco') + '/',
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        metainfo=dict(classes=('circle', 'square', 'triangle')))
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=1, val_interval=100)
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=1, by_epoch=False)
    cfg.work_dir = str(tmp_path)
    register_scope_modules('mmdet')
    runner = Runner.from_cfg(cfg)
    weight = runner.model.backbone.layers[3].blocks[0].ffn.fc1.weight
    before = weight.detach().clone()
    runner.train()
    assert runner.iter == 1 and (tmp_path / 'iter_1.pth').is_file()
    loss = runner.message_hub.get_scalar('train/loss').current()
    assert loss == loss and loss > 0  # finite, positive
    assert not torch.equal(before, weight.detach())
