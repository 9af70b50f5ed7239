"""Training on the tiny sets: Mask R-CNN through the launchers, UPerNet and classification in process (train, resume
in mixed precision, evaluate); upstream's Mask R-CNN and UPerNet configs with only the backbone swapped (full tier)."""
import copy
import math
import pickle

import pytest
import torch
from mmengine.config import Config

import mmppma  # noqa: F401  (allowlists mmengine checkpoint globals for torch.load(weights_only=True))

from ..conftest import load_tool
from .conftest import TINY_CLS, TINY_DET, TINY_SEG, TOOLS, run_tool, scalar_records, train_iters

pytestmark = pytest.mark.slow
# untrained heads score below mmdet's 0.05 threshold: keep every box so CocoMetric has results to score
KEEP_ALL = ['model.test_cfg.rcnn.score_thr=0.0']


def test_det_train_resume_test_through_the_launchers(tiny_env, tmp_path):
    pytest.importorskip('mmdet.models')
    work = tmp_path / 'work'
    common = ['default_hooks.checkpoint.interval=2', 'default_hooks.logger.interval=1', *KEEP_ALL]
    first = run_tool([TOOLS / 'train.py', TINY_DET, '--work-dir', work, '--cfg-options', 'train_cfg.max_iters=2',
                      'train_cfg.val_interval=2', *common], tiny_env)
    assert train_iters(first.stdout + first.stderr) == [1, 2] and (work / 'iter_2.pth').is_file()
    [metrics] = [r for r in scalar_records(work) if 'coco/bbox_mAP' in r]
    for key in ('coco/bbox_mAP', 'coco/bbox_mAP_50', 'coco/segm_mAP', 'coco/segm_mAP_50'):
        assert isinstance(metrics[key], float) and 0.0 <= metrics[key] <= 1.0, key
    # --resume without a path: the latest checkpoint of the work dir; the iteration counter goes on at 3; --amp on
    # CPU: bfloat16 autocast (mmcv's NMS and RoIAlign in float32), finite losses
    second = run_tool([TOOLS / 'train.py', TINY_DET, '--work-dir', work, '--resume', '--amp', '--cfg-options',
                       'train_cfg.max_iters=4', 'train_cfg.val_interval=100', *common], tiny_env)
    log = second.stdout + second.stderr
    assert 'resumed' in log.lower() and train_iters(log) == [3, 4]
    assert torch.cuda.is_available() or 'bfloat16 autocast (mmppma.CPUAmpOptimWrapper)' in log
    losses = [r['loss'] for r in scalar_records(work) if 'loss' in r]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses), losses
    state = torch.load(work / 'iter_4.pth', map_location='cpu', weights_only=True)
    before = torch.load(work / 'iter_2.pth', map_location='cpu', weights_only=True)['state_dict']
    key = 'backbone.layers.2.blocks.0.retention.path_embed.A_log'
    assert state['meta']['iter'] == 4 and not torch.equal(before[key], state['state_dict'][key])  # decays trained
    out = tmp_path / 'preds.pkl'
    test = run_tool([TOOLS / 'test.py', TINY_DET, work / 'iter_4.pth', '--work-dir', tmp_path / 'test', '--out', out,
                     '--cfg-options', *KEEP_ALL], tiny_env)
    assert 'coco/segm_mAP' in test.stdout + test.stderr
    preds = pickle.loads(out.read_bytes())
    assert len(preds) == 6 and {'bboxes', 'labels', 'masks', 'scores'} <= set(preds[0]['pred_instances'])


def build_runner(cfg: Config, work_dir, scope: str):
    from mmengine.runner import Runner

    from mmppma.utils import register_scope_modules
    register_scope_modules(scope)
    cfg = copy.deepcopy(cfg)
    cfg.work_dir = str(work_dir)
    return Runner.from_cfg(cfg)


@pytest.mark.parametrize('task', ['seg', 'cls'])
def test_train_resume_evaluate_in_process(task, tiny_env, tmp_path):
    """2 iterations with a validation and a checkpoint, then resumed from the work dir's latest to 4; the metrics
    in range; UPerNet's resumed scheduler went on from iteration 2, not from 0."""
    if task == 'seg':
        pytest.importorskip('mmseg.models')
    else:
        try:
            import mmpretrain.datasets  # noqa: F401
            import mmpretrain.evaluation  # noqa: F401
        except ImportError as e:
            pytest.skip(f"mmpretrain's data pipeline and metrics do not import here ({e}); they need torchvision")
    config, scope, keys = {'seg': (TINY_SEG, 'mmseg', ('mIoU', 'aAcc', 'mAcc')),
                           'cls': (TINY_CLS, 'mmpretrain', ('accuracy/top1', ))}[task]
    cfg = Config.fromfile(str(config))
    cfg.train_cfg.update(max_iters=2, val_interval=2)
    cfg.default_hooks.checkpoint.update(interval=2)
    cfg.default_hooks.logger.update(interval=1)
    runner = build_runner(cfg, tmp_path, scope)
    runner.train()
    assert runner.iter == 2 and (tmp_path / 'iter_2.pth').is_file()
    metrics = runner.message_hub.runtime_info.get('last_val_metrics') or {  # older mmengine: only as scalars
        k[len('val/'):]: v.current() for k, v in runner.message_hub.log_scalars.items() if k.startswith('val/')}
    for key in keys:
        assert isinstance(metrics.get(key), float) and 0.0 <= metrics[key] <= 100.0, (key, metrics)
    cfg.train_cfg.update(max_iters=4, val_interval=100)
    cfg.resume, cfg.load_from = True, None  # latest checkpoint of the work dir
    load_tool('train.py').apply_amp(cfg, True)  # the resumed steps in mixed precision (CPU: bfloat16 autocast)
    resumed = build_runner(cfg, tmp_path, scope)
    resumed.train()
    assert resumed.iter == 4 and torch.load(tmp_path / 'iter_4.pth', weights_only=True)['meta']['iter'] == 4
    losses = resumed.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses), losses  # the history goes on from 2
    if task == 'seg':  # 4 warmup steps taken (LinearLR spans end - begin - 1 = 19 steps); a restart would show 2
        assert resumed.optim_wrapper.get_lr()['lr'][0] == pytest.approx(2e-4 * (1e-3 + (1 - 1e-3) * 4 / 19), rel=1e-3)
    final = resumed.val_loop.run()
    assert 0.0 <= final[keys[0]] <= 100.0 and set(final) >= set(keys[:2])


# library -> (upstream config with the backbone swapped, the dataloader's data settings)
UPSTREAM = {
    'mmdet': ("""_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
model = dict(backbone=dict(_delete_=True, type='mmppma.PPMA', arch='tiny', out_indices=(0, 1, 2, 3)),
             neck=dict(in_channels=[64, 128, 256, 512]))""",
              lambda root: dict(data_root=str(root / 'coco') + '/', ann_file='annotations/instances_train.json',
                                data_prefix=dict(img='train/'), metainfo=dict(classes=('circle', 'square', 'triangle'))
                                ), 1),
    'mmseg': ("""_base_ = 'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py'
model = dict(pretrained=None, backbone=dict(_delete_=True, type='mmppma.PPMA', arch='tiny', out_indices=(0, 1, 2, 3)),
             decode_head=dict(in_channels=[64, 128, 256, 512]), auxiliary_head=dict(in_channels=256))""",
              lambda root: dict(data_root=str(root / 'ade')), 2),
}


@pytest.mark.heavy  # a PPMA-T step at the upstream pipeline's full image size
@pytest.mark.parametrize('library', UPSTREAM)
def test_upstream_config_with_ppma_backbone_trains_a_step(library, tiny_data, tmp_path):
    """mmdet's mask-rcnn_r50_fpn_1x_coco.py / mmseg's upernet_r50_4xb4-160k_ade20k-512x512.py, backbone -> PPMA-T
    and the in_channels; data -> the tiny set (no workers); their pipelines and heads as they are."""
    pytest.importorskip(f'{library}.models')
    text, data, batch = UPSTREAM[library]
    cfg = Config.fromstring(text, file_format='.py')
    cfg.train_dataloader.update(batch_size=batch, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.update(data(tiny_data))
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=1, val_interval=100)
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=1, by_epoch=False)
    runner = build_runner(cfg, tmp_path, library)
    weight = runner.model.backbone.layers[3].blocks[0].ffn.fc1.weight
    before = weight.detach().clone()
    runner.train()
    assert runner.iter == 1 and (tmp_path / 'iter_1.pth').is_file()
    loss = runner.message_hub.get_scalar('train/loss').current()
    assert loss == loss and loss > 0 and not torch.equal(before, weight.detach())  # finite, positive; trained
