"""The tools no other test runs, started as a user starts them at tiny sizes: the smoke demo, the FLOP counter, the
op and compile benchmarks, the Slurm launcher (a stand-in srun) and the tiny COCO demo's arguments."""
import os
import re
import subprocess

import torch

from mmppma.models import PPMA

from .conftest import TOOLS


def test_demo_builds_ppma_and_steps(run_python):
    out = run_python([TOOLS / 'demo.py', '--arch', 'tiny', '--batch', '1', '--size', '48', '--iters', '1']).stdout
    with torch.device('meta'):
        params = sum(p.numel() for p in PPMA('tiny').parameters())
    assert f'{params:,} parameters' in out and 'out[3]: (1, 512, 2, 2)' in out, out  # 48 / 32, rounded up
    assert 'PPMA smoke run OK' in out


def test_get_flops_counts_a_classifier(run_python):
    """PPMA-T with its head: 14,335,272 parameters (docs/method.md §7); FLOPs at a small size."""
    out = run_python([TOOLS / 'get_flops.py', '--model', 'PPMA', '--arch', 'tiny', '--shape', '64', '96']).stdout
    assert '(14,335,272)' in out and 'at 64x96' in out, out
    assert float(re.search(r'([\d.]+) GFLOPs', out).group(1)) > 0


def test_benchmark_ops_prints_a_table(run_python):
    out = run_python([TOOLS / 'benchmark_ops.py', '--cases', 'whole_196', '--impls', 'torch', 'reference',
                      '--device', 'cpu', '--repeat', '1']).stdout
    assert 'whole_196' in out and 'torch' in out and 'reference' in out, out


def test_benchmark_compile_names_the_tool_it_is_folded_into(run_python):
    for args in ([], ['--models', 'PPMA', '--modes', 'train']):
        out = run_python([TOOLS / 'benchmark_compile.py', *args], check=False)
        assert out.returncode == 2 and 'tools/benchmark_model.py --compile none default' in out.stderr


def test_slurm_train_starts_one_task_per_gpu(tmp_path):
    """srun gets the partition, job, GPU and task counts, and runs tools/train.py with the Slurm launcher."""
    (tmp_path / 'srun').write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (tmp_path / 'srun').chmod(0o755)
    env = dict(os.environ, PATH=f'{tmp_path}:{os.environ["PATH"]}', GPUS='16', GPUS_PER_NODE='8', PYTHON='py')
    args = ['bash', TOOLS / 'slurm_train.sh', 'gpu', 'job1', 'cfg.py', 'work', '--amp']
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[:2] == ['-p', 'gpu'] and '--job-name=job1' in out and '--ntasks=16' in out
    assert '--gres=gpu:8' in out and '--ntasks-per-node=8' in out
    i = out.index('py')
    assert out[i:] == ['py', '-u', str(TOOLS / 'train.py'), 'cfg.py', '--work-dir=work', '--launcher', 'slurm', '--amp']
    short = subprocess.run(['bash', TOOLS / 'slurm_train.sh', 'gpu'], capture_output=True, text=True)
    assert short.returncode == 2 and 'usage' in short.stderr


def test_tiny_coco_demo_arguments():
    run = [['bash', TOOLS / 'tiny_coco_demo.sh', *a] for a in (['--help'], ['--iters', '0'], ['--frobnicate'])]
    helped, zero, unknown = (subprocess.run(a, capture_output=True, text=True) for a in run)
    assert helped.returncode == 0 and '--iters N' in helped.stdout
    assert zero.returncode == 2 and 'positive integer' in zero.stderr
    assert unknown.returncode == 2 and "unknown argument '--frobnicate'" in unknown.stderr
