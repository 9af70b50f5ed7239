"""End-to-end fixtures: the tiny data sets (made once per session, smaller than the defaults) and helpers to run
the repository's launchers and read what they wrote."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import pytest
import torch

from ..conftest import REPO_ROOT as REPO
from ..conftest import TOOLS, run

CONFIGS = REPO / 'configs'
TINY_DET = CONFIGS / 'tiny' / 'mask_rcnn_ppma_t_tiny_coco.py'
TINY_SEG = CONFIGS / 'tiny' / 'upernet_ppma_t_tiny_ade.py'
TINY_CLS = CONFIGS / 'tiny' / 'ppma_t_tiny_in.py'
#: Per-session counts: (train, val); imagenet per class. Small, but every class appears in every split.
SESSION_COUNTS = dict(coco=(12, 6), ade=(8, 4), imagenet=(4, 2))


def make_data(out: Path, counts: Dict[str, Sequence[int]] = SESSION_COUNTS, seed: int = 0,
              tasks: Sequence[str] = ('coco', 'ade', 'imagenet')) -> subprocess.CompletedProcess:
    args = [sys.executable, str(TOOLS / 'make_tiny_datasets.py'), '--out', str(out), '--seed', str(seed),
            '--tasks', *tasks]
    for task in tasks:
        args += [f'--{task}-train', str(counts[task][0]), f'--{task}-val', str(counts[task][1])]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory) -> Path:
    """The three tiny sets under one root (what $MMPPMA_TINY_DATA names)."""
    root = tmp_path_factory.mktemp('tiny_data')
    proc = make_data(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


@pytest.fixture
def tiny_env(tiny_data, monkeypatch) -> Dict[str, str]:
    """Environment for configs/tiny/*: in this process (Config.fromfile) and for subprocesses."""
    monkeypatch.setenv('MMPPMA_TINY_DATA', str(tiny_data))
    # as many threads as this test process has: under pytest-xdist the workers share the cores
    return dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()), PYTHONWARNINGS='ignore',
                PYTHONPATH=str(REPO))


run_tool = run  # a tools/ script (python or shell) with an environment; fails the test with the output's tail


def scalar_records(work_dir: Path) -> List[dict]:
    """Every record mmengine's LocalVisBackend wrote (train scalars and validation metrics), oldest first."""
    return [json.loads(line) for path in sorted(work_dir.glob('*/vis_data/scalars.json'))
            for line in path.read_text().splitlines() if line.strip()]


def train_iters(log_text: str) -> List[int]:
    """Iteration numbers of the ``Iter(train) [i/N]`` log lines."""
    return [int(m) for m in re.findall(r'Iter\(train\) \[\s*(\d+)/\d+\]', log_text)]
