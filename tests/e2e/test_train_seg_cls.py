"""UPerNet and classification end to end on the tiny sets, in-process through mmengine's Runner (the
launchers are exercised by the detection and distributed tests): train, checkpoint, resume, evaluate."""
import copy

import pytest
import torch
from mmengine.config import Config

import mmppma  # noqa: F401  (allowlists mmengine checkpoint globals for torch.load(weights_only=True))

from .conftest import TINY_CLS, TINY_SEG

pytestmark = pytest.mark.slow


def build_runner(cfg: Config, work_dir, scope: str):
    from mmengine.runner import Runner

    from mmppma.utils import register_scope_modules
    register_scope_modules(scope)
    cfg = copy.deepcopy(cfg)
    cfg.work_dir = str(work_dir)
    return Runner.from_cfg(cfg)


def train_two_then_resume_to_four(cfg: Config, work_dir, scope: str):
    """-> (metrics of the validation after iteration 2, the resumed runner after 4 iterations)."""
    cfg.train_cfg.update(max_iters=2, val_interval=2)
    cfg.default_hooks.checkpoint.update(interval=2)
    cfg.default_hooks.logger.update(interval=1)
    runner = build_runner(cfg, work_dir, scope)
    runner.train()
    assert runner.iter == 2 and (work_dir / 'iter_2.pth').is_file()
    metrics = runner.message_hub.runtime_info.get('last_val_metrics') or {}
    if not metrics:  # older mmengine keeps them only as scalars
        metrics = {k[len('val/'):]: v.current() for k, v in runner.message_hub.log_scalars.items()
                   if k.startswith('val/')}

    cfg.train_cfg.update(max_iters=4, val_interval=100)
    cfg.resume, cfg.load_from = True, None  # latest checkpoint of the work dir
    resumed = build_runner(cfg, work_dir, scope)
    resumed.train()
    assert resumed.iter == 4 and (work_dir / 'iter_4.pth').is_file()
    assert torch.load(work_dir / 'iter_4.pth', weights_only=True)['meta']['iter'] == 4
    return metrics, resumed


def test_upernet_train_resume_evaluate(tiny_env, tmp_path):
    pytest.importorskip('mmseg.models')
    cfg = Config.fromfile(str(TINY_SEG))
    metrics, runner = train_two_then_resume_to_four(cfg, tmp_path, 'mmseg')
    for key in ('mIoU', 'aAcc', 'mAcc'):
        assert isinstance(metrics.get(key), float) and 0.0 <= metrics[key] <= 100.0, (key, metrics)
    # the resumed runner started at iteration 2: its scheduler state went on from there, not from 0
    lr = runner.optim_wrapper.get_lr()['lr'][0]
    # 4 warmup steps taken (mmengine's LinearLR spans end - begin - 1 = 19 steps); a restart would show 2
    assert lr == pytest.approx(2e-4 * (1e-3 + (1 - 1e-3) * 4 / 19), rel=1e-3)
    final = runner.val_loop.run()
    assert set(final) >= {'mIoU', 'aAcc'} and 0.0 <= final['mIoU'] <= 100.0


@pytest.mark.heavy  # a PPMA-T step at the upstream pipeline's full image size
def test_upstream_upernet_config_with_ppma_backbone_trains_a_step(tiny_data, tmp_path):
    """mmseg's own upernet_r50_4xb4-160k_ade20k-512x512.py, backbone -> PPMA-T and the heads' in_channels;
    data root -> the tiny ADE-layout set (batch 2, no workers); its 512 crop pipeline and heads as they are."""
    pytest.importorskip('mmseg.models')
    cfg = Config.fromstring(
        """
_base_ = 'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py'
model = dict(
    pretrained=None,
    backbone=dict(_delete_=True, type='mmppma.PPMA', arch='tiny', out_indices=(0, 1, 2, 3)),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))
""", file_format='.py')
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.data_root = str(tiny_data / 'ade')
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=1, val_interval=100)
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.default_hooks.checkpoint.update(interval=1)
    runner = build_runner(cfg, tmp_path, 'mmseg')
    weight = runner.model.backbone.layers[3].blocks[0].ffn.fc1.weight
    before = weight.detach().clone()
    runner.train()
    assert runner.iter == 1 and (tmp_path / 'iter_1.pth').is_file()
    assert not torch.equal(before, weight.detach())


def test_classification_train_resume_evaluate(tiny_env, tmp_path):
    try:
        import mmpretrain.datasets  # noqa: F401
        import mmpretrain.evaluation  # noqa: F401
    except ImportError as e:
        pytest.skip(f"mmpretrain's data pipeline and metrics do not import here ({e}); they need torchvision")
    cfg = Config.fromfile(str(TINY_CLS))
    metrics, runner = train_two_then_resume_to_four(cfg, tmp_path, 'mmpretrain')
    assert 0.0 <= metrics['accuracy/top1'] <= 100.0
    final = runner.val_loop.run()
    assert 0.0 <= final['accuracy/top1'] <= 100.0
