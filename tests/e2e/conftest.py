"""End-to-end fixtures: the tiny data sets (made once per session, smaller than the defaults) and helpers to
run the repository's launchers and read what they wrote."""
import glob
import json
import os
import os.path as osp
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / 'tools'
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
        train, val = counts[task]
        args += [f'--{task}-train', str(train), f'--{task}-val', str(val)]
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
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS='2', PYTHONWARNINGS='ignore', PYTHONPATH=str(REPO))
    return env


def run_tool(args: Sequence[str], env: Dict[str, str], timeout: float = 300,
             cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run a tools/ script (python file or shell script); fail the test with the output tail on error."""
    script = str(args[0])
    cmd = (['bash'] if script.endswith('.sh') else [sys.executable]) + [str(a) for a in args]
    proc = subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f'`{" ".join(cmd)}` exited with {proc.returncode}\n--- stdout (tail) ---\n'
                    f'{proc.stdout[-3000:]}\n--- stderr (tail) ---\n{proc.stderr[-5000:]}')
    return proc


def scalar_records(work_dir: Path) -> List[dict]:
    """Every record mmengine's LocalVisBackend wrote (train scalars and validation metrics), oldest first."""
    records = []
    for path in sorted(glob.glob(osp.join(str(work_dir), '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def train_iters(log_text: str) -> List[int]:
    """Iteration numbers of the ``Iter(train) [i/N]`` log lines."""
    import re
    return [int(m) for m in re.findall(r'Iter\(train\) \[\s*(\d+)/\d+\]', log_text)]
