"""``compile=True`` through the launcher: the tiny detection and segmentation configs train a few iterations
with mmengine compiling the model's ``train_step`` (``torch.compile`` with its defaults)."""
import math

import pytest

from .conftest import TINY_DET, TINY_SEG, TOOLS, run_tool, scalar_records, train_iters

pytestmark = pytest.mark.slow


@pytest.mark.parametrize('config, library', [(TINY_DET, 'mmdet.models'), (TINY_SEG, 'mmseg.models')],
                         ids=['mask_rcnn', 'upernet'])
def test_tiny_config_trains_with_compile_true(config, library, tiny_env, tmp_path):
    pytest.importorskip(library)
    work = tmp_path / 'work'
    # dynamo's INFO log names each frame it compiles and the compiler it hands the graph to
    env = dict(tiny_env, TORCH_LOGS='dynamo')
    proc = run_tool([TOOLS / 'train.py', config, '--work-dir', work, '--cfg-options', 'compile=True',
                     'train_cfg.max_iters=3', 'train_cfg.val_interval=100', 'default_hooks.logger.interval=1',
                     'default_hooks.checkpoint.interval=100'], env, timeout=1200)
    log = proc.stdout + proc.stderr
    assert train_iters(log) == [1, 2, 3]
    assert 'calling compiler function inductor' in log
    # the backbone's forward was compiled, not only mmengine's wrappers around it
    assert 'start tracing forward' in log
    losses = [r['loss'] for r in scalar_records(work) if 'loss' in r]
    assert len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses)
