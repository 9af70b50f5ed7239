"""tools/dist_train.sh / dist_test.sh: two processes on CPU (gloo), both stepping."""
import glob
import socket

import pytest

from .conftest import TINY_SEG, TOOLS, run_tool, train_iters

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_dist_train_two_processes_both_step_then_dist_test(tiny_env, tmp_path):
    pytest.importorskip('mmseg.models')
    env = dict(tiny_env, PORT=str(free_port()), OMP_NUM_THREADS='1')
    work = tmp_path / 'work'
    # log_level=DEBUG makes mmengine write one log file per rank (rank 0 alone logs otherwise)
    proc = run_tool([TOOLS / 'dist_train.sh', TINY_SEG, '2', '--work-dir', work, '--cfg-options', 'log_level=DEBUG',
                     'train_cfg.max_iters=4', 'train_cfg.val_interval=4', 'default_hooks.checkpoint.interval=4',
                     'default_hooks.logger.interval=1'], env, timeout=400)
    out = proc.stdout + proc.stderr
    assert 'gloo' in out  # tools/train.py's CPU fallback
    logs = {rank: glob.glob(str(work / '*' / f'*rank{rank}.log')) for rank in (0, 1)}
    assert all(len(files) == 1 for files in logs.values()), logs
    losses = {}
    for rank, (path, ) in logs.items():
        text = open(path).read()
        assert 'Distributed training: True' in text and 'MMDistributedDataParallel' in text
        assert 'Iter(val) [2/2]' in text  # 4 validation images split over 2 ranks
        assert train_iters(text) == [1, 2, 3, 4], f'rank {rank} did not log 4 training steps'
        losses[rank] = [line.split(' loss: ')[1].split()[0] for line in text.splitlines() if 'Iter(train)' in line]
    # each rank trained on its own half of the data: the logged per-rank losses differ
    assert losses[0] != losses[1]
    assert (work / 'iter_4.pth').is_file()

    test = run_tool([TOOLS / 'dist_test.sh', TINY_SEG, work / 'iter_4.pth', '2', '--work-dir', tmp_path / 'test'],
                    dict(env, PORT=str(free_port())), timeout=300)
    assert 'mIoU' in test.stdout + test.stderr
