"""tools/check_kernels.py: every Triton kernel specialization of the reduced shape set compiles for sm_80 and
sm_90 within shared memory and without register spills (ptxas's own report); --write puts the same rows in a
markdown page whose header names the command."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')


@pytest.mark.slow
def test_quick_check_compiles_for_a100_and_h100(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}  # compile for the GPU target
    env['XDG_CACHE_HOME'] = str(tmp_path)  # no results cached by earlier runs
    env['TRITON_CACHE_DIR'] = str(tmp_path / 'triton')
    table = tmp_path / 'table.md'
    command = [sys.executable, 'tools/check_kernels.py', '--quick', '--arch', '80', '90', '--jobs', '2',
               '--max-seconds', '60', '--write', str(table)]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith('_')]
    kernels = {line.split()[0] for line in rows}
    assert {'_whole_fwd', '_whole_bwd', '_line_fwd', '_line_bwd', '_scan_kernel'} <= kernels, kernels
    assert all(line.split()[1] in ('80', '90') and line.rstrip().endswith('ok') for line in rows)
    assert ' 0 failed' in run.stdout
    page = table.read_text()
    assert f'`python tools/check_kernels.py {" ".join(command[2:])}`' in page
    assert sum(line.startswith('| `_') for line in page.splitlines()) == len(rows)
