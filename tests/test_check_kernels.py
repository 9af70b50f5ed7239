"""tools/check_kernels.py: the reduced shape set's kernels (TF32 included) compile for sm_80 / sm_90 within shared
memory, without spills, every forward loop pipelined; --write's page; the grid check, TF32 rows, async-copy count."""
import os
import subprocess
import sys

import pytest
import torch

from .conftest import REPO_ROOT, load_tool

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
tool = load_tool('check_kernels.py')


@pytest.fixture
def compile_env(tmp_path) -> dict:
    """Compiling for the GPU target (not the interpreter), with no results cached by earlier runs."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    return dict(env, XDG_CACHE_HOME=str(tmp_path), TRITON_CACHE_DIR=str(tmp_path / 'triton'))


@pytest.mark.slow
def test_quick_check_compiles_for_a100_and_h100(tmp_path, compile_env):
    table = tmp_path / 'table.md'
    command = [sys.executable, 'tools/check_kernels.py', '--quick', '--arch', '80', '90', '--jobs', '2',
               '--max-seconds', '60', '--write', str(table)]
    run = subprocess.run(command, cwd=REPO_ROOT, env=compile_env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith('_')]
    kernels = {line.split()[0] for line in rows}
    assert {'_whole_fwd', '_whole_bwd', '_line_fwd', '_line_bwd', '_scan_kernel'} <= kernels, kernels
    assert all(line.split()[1] in ('80', '90') and line.rstrip().endswith('ok') for line in rows)
    assert {line.split()[2] for line in rows} == {'fp32', 'tf32', 'fp16'}
    # every forward's key loop is software-pipelined
    forward = [line.split() for line in rows if line.split()[3] == 'fwd']
    assert forward and all(int(row[-3]) > 0 for row in forward), [row for row in forward if int(row[-3]) == 0]
    assert ' 0 failed' in run.stdout
    page = table.read_text()
    assert f'`python tools/check_kernels.py {" ".join(command[2:])}`' in page
    assert sum(line.startswith('| `_') for line in page.splitlines()) == len(rows)


def test_grid_check_names_the_axes_over_cuda_limits():
    assert tool.grid_problems((2**31 - 1, 65535, 65535)) == []
    assert tool.grid_problems((2**31, 65536, 1)) == ['grid axis 0 = 2147483648 > 2147483647',
                                                     'grid axis 1 = 65536 > 65535']
    ok = dict(shared=0, registers=32, spill=0, seconds=0.0, async_copies=0)
    spec = dict(desc=dict(arch=80), grid=(4, 70000, 1))
    assert tool.status(spec, ok, 0) == 'grid axis 1 = 70000 > 65535'
    assert tool.status(dict(spec, grid=(4, 100, 1)), ok, 0) == 'ok'


def test_tf32_rows_record_tf32_launches_and_restore_the_setting():
    """The 'tf32' rows compile float32 launches with TF32 products; the setting is restored after recording."""
    from mmppma.ops.triton_support import launch as lp
    before = lp.precision(torch.float32)
    for name, want in (('tf32', 'tf32'), ('fp32', 'ieee')):
        with lp.tf32_matmuls(name == 'tf32'):  # as the tool's main loop records a row
            launches = tool.record('cc', (1, 2, 8, 8, 16), tool.DTYPES[name], 80)
        assert launches and {x.constexprs['PRECISION'] for _, x in launches} == {want}
        assert lp.precision(torch.float32) == before
    assert 'tf32' in tool.QUICK_DTYPES


# a matmul loop, compiled for sm_80 and sm_90 with 3 stages and with 1: the async copies counted in each TTGIR
_PIPELINED = """
import re, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    a = a_ptr + rows[:, None] * K + rows[None, :]
    b = b_ptr + rows[:, None] * BLOCK + rows[None, :]
    acc = tl.zeros([BLOCK, BLOCK], tl.float32)
    for _ in range(0, K, BLOCK):
        acc = tl.dot(tl.load(a), tl.load(b), acc)
        a += BLOCK
        b += BLOCK * BLOCK
    tl.store(c_ptr + rows[:, None] * BLOCK + rows[None, :], acc)

signature = {'a_ptr': '*fp16', 'b_ptr': '*fp16', 'c_ptr': '*fp32', 'K': 'i32', 'BLOCK': 'constexpr'}
attrs = {(i, ): [['tt.divisibility', 16]] for i in range(4)}
for arch in (80, 90):
    for stages in (3, 1):
        compiled = triton.compile(ASTSource(matmul, signature, {'BLOCK': 32}, attrs),
                                  target=GPUTarget('cuda', arch, 32), options=dict(num_warps=4, num_stages=stages))
        print(arch, stages, len(re.findall(sys.argv[1], compiled.asm['ttgir'])))
"""


@pytest.mark.slow
def test_async_copy_pattern_matches_a_pipelined_loop(tmp_path, compile_env):
    """The pattern counts the asynchronous copies (per load, one per stage) of a pipelined matmul loop, as
    triton prints them for sm_80 and sm_90, and none in the same loop not pipelined."""
    script = tmp_path / 'pipelined.py'  # triton reads a kernel's source from its file
    script.write_text(_PIPELINED)
    run = subprocess.run([sys.executable, str(script), tool.ASYNC_COPY], env=compile_env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    counts = {tuple(map(int, line.split()[:2])): int(line.split()[2]) for line in run.stdout.splitlines()}
    assert counts == {(80, 3): 6, (80, 1): 0, (90, 3): 6, (90, 1): 0}
