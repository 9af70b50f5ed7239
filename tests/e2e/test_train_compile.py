"""Full tier: ``compile=True`` through tools/train.py on inductor: the tiny Mask R-CNN and UPerNet, one block per
stage, train with a compiled ``train_step`` (the default tier's aot_eager trace: tests/models/test_compile.py)."""
import math

import pytest

from .conftest import TINY_DET, TINY_SEG, TOOLS, run_tool, scalar_records, train_iters

# PPMA-T's widths, heads and attention types, one block per stage
ONE_BLOCK_PER_STAGE = dict(embed_dims=[64, 128, 256, 512], depths=[1, 1, 1, 1], num_heads=[4, 4, 8, 16],
                           mlp_ratios=[3, 3, 3, 3], attn_types=['criss_cross', 'criss_cross', 'whole', 'whole'])


# Detection: every image 192 x 192, so that Mask R-CNN's many graphs compile once, not once per input size (minutes
# each). Its second iteration still recompiles the heads' graphs whose shapes follow the number of objects (about
# 2 minutes): two iterations, where segmentation runs three.
FIXED_SIZE_DET = """
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(192, 192), keep_ratio=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
"""


@pytest.mark.parametrize('config, library, extra, iters', [
    pytest.param(TINY_DET, 'mmdet', FIXED_SIZE_DET, 2, id='det', marks=[pytest.mark.heavy,
                                                                        pytest.mark.slow(minutes=18)]),
    pytest.param(TINY_SEG, 'mmseg', '', 3, id='seg', marks=[pytest.mark.heavy, pytest.mark.slow(minutes=14)])])
def test_tiny_config_trains_with_compile(config, library, extra, iters, tiny_env, tmp_path):
    pytest.importorskip(f'{library}.models')
    cfg_file = tmp_path / 'one_block_per_stage.py'
    cfg_file.write_text(f'_base_ = {str(config)!r}\n'
                        f'model = dict(backbone=dict(arch=dict(_delete_=True, **{ONE_BLOCK_PER_STAGE!r})))\n'
                        + extra)
    work = tmp_path / 'work'
    # dynamo's INFO log names each frame it compiles: train_step itself must be among them
    env = dict(tiny_env, TORCH_LOGS='dynamo')
    proc = run_tool([TOOLS / 'train.py', cfg_file, '--work-dir', work, '--cfg-options', 'compile=True',
                     f'train_cfg.max_iters={iters}', 'train_cfg.val_interval=100', 'default_hooks.logger.interval=1',
                     'default_hooks.checkpoint.interval=100'], env, timeout=2700)
    log = proc.stdout + proc.stderr
    assert 'start tracing train_step' in log, log[-3000:]
    assert 'recompile_limit' not in log and 'cache_size_limit' not in log
    assert train_iters(log) == list(range(1, iters + 1))
    losses = [r['loss'] for r in scalar_records(work) if 'loss' in r]
    assert len(losses) == iters and all(math.isfinite(v) for v in losses), losses
