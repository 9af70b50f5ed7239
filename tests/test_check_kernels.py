"""tools/check_kernels.py: the reduced shape set's kernels (TF32 included) compile for sm_80 / sm_90 within shared
memory, without spills, every forward loop pipelined; --write's page; the grid check, TF32 rows, async-copy count."""
import os
import re
import subprocess
import sys

import pytest
import torch

from .conftest import REPO_ROOT, load_tool

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
tool = load_tool('check_kernels.py')


#: the attention kernels the quick check's shapes launch (PPMA-T's and MLLA-T's); PPMA's also launch the decay
#: tables' kernels (no products, no key loop)
KERNELS = {'_whole_fwd', '_whole_bwd', '_line_fwd', '_line_bwd', '_ppmla_fwd', '_ppmla_bwd'}
TABLES = {'_tables_fwd', '_tables_bwd'}
#: the chunked form's passes and its backward's walks (MLLA-T's 128 x 128 stage 1 at 512 x 512 runs them; no key loop,
#: compiled and checked only)
CHUNKED = {'_queries', '_update', '_grad_queries', '_grad_keys', '_update_queries'}


@pytest.fixture
def compile_env(tmp_path) -> dict:
    """Compiling for the GPU target (not the interpreter), with no results cached by earlier runs."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    return dict(env, XDG_CACHE_HOME=str(tmp_path), TRITON_CACHE_DIR=str(tmp_path / 'triton'))


@pytest.mark.parametrize('scope', [
    pytest.param(('--one-shape', '--dtype', 'fp32', 'tf32', '--arch', '90'), marks=pytest.mark.slow, id='one-shape'),
    pytest.param(('--arch', '80', '90'), marks=pytest.mark.heavy, id='quick-set')])
def test_quick_check_compiles_for_a100_and_h100(scope, tmp_path, compile_env):
    """The quick set on sm_80 and sm_90 (the full tier), or one shape per kernel in float32 and TF32 on sm_90 (the
    test tier; half precision on both: :func:`test_quick_sass_cost_one_shape_per_kernel`): every row within the
    limits, every forward pipelined."""
    table = tmp_path / 'table.md'
    command = [sys.executable, 'tools/check_kernels.py', '--quick', *scope, '--jobs', '2', '--max-seconds', '60',
               '--write', str(table)]
    run = subprocess.run(command, cwd=REPO_ROOT, env=compile_env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith('_')]
    kernels = {line.split()[0] for line in rows}
    assert kernels == KERNELS | TABLES | CHUNKED, kernels
    assert all(line.split()[1] in ('80', '90') and line.rstrip().endswith('ok') for line in rows)
    assert {line.split()[1] for line in rows} == set(scope[scope.index('--arch') + 1:])
    one_shape = '--one-shape' in scope
    assert {line.split()[2] for line in rows} == ({'fp32', 'tf32'} if one_shape else {'fp32', 'tf32', 'fp16'})
    # every forward's key loop is software-pipelined
    forward = [line.split() for line in rows if line.split()[3] == 'fwd' and line.split()[0] in KERNELS]
    assert forward and all(int(row[-3]) > 0 for row in forward), [row for row in forward if int(row[-3]) == 0]
    assert ' 0 failed' in run.stdout
    page = table.read_text()
    assert f'`python tools/check_kernels.py {" ".join(command[2:])}`' in page
    assert sum(line.startswith('| `_') for line in page.splitlines()) == len(rows)


def test_kernels_at_the_h200_runs_revision():
    """--kernels-at takes mmppma/ of a revision with this tool's pricing: that of the H200 run (its devices in
    mmppma.ops.dispatch) imports; launches of its kernels, which have no BOTH constexpr, are priced part by part
    without one, and today's both-roles launches part by part with BOTH off."""
    revision = '2e28041'
    if subprocess.run(['git', '-C', str(REPO_ROOT), 'cat-file', '-e', revision + '^{commit}']).returncode:
        pytest.skip(f'this checkout lacks the history of {revision} (a shallow clone)')
    run = subprocess.run([sys.executable, 'tools/check_kernels.py', '--kernels-at', revision, '--help'], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and '--kernels-at' in run.stdout, run.stderr[-2000:]
    old = dict(KEYS=False, V2H=True, H2V=True, PRECISION=None)
    assert tool.parts_apart(old) == [dict(old, H2V=False), dict(old, V2H=False)]
    both = dict(old, BOTH=True)
    parts = [(c['KEYS'], c['BOTH'], c['V2H'], c['H2V']) for c in tool.parts_apart(both)]
    assert parts == [(keys, False, v2h, not v2h) for keys in (False, True) for v2h in (True, False)]


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
        products = [x for _, x in launches if x.name not in TABLES]
        assert products and {x.constexprs['PRECISION'] for x in products} == {want}
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


# the kernels whose key loops --sass-limit holds to check_kernels.SASS_LIMITS in the quick set (the others are
# reported only)
SASS_ENFORCED = ('_whole_fwd', '_whole_bwd', '_line_fwd', '_line_bwd')


@pytest.mark.slow
def test_quick_sass_cost_one_shape_per_kernel(tmp_path, compile_env):
    """--sass: every kernel's key loop is priced against the plain flash kernel, for one shape per kernel, fp16,
    sm_80 and sm_90; the kernels of SASS_ENFORCED within their limits."""
    table = tmp_path / 'table.md'
    limit = ['--sass-limit', *SASS_ENFORCED] if SASS_ENFORCED else ['--sass']
    command = [sys.executable, 'tools/check_kernels.py', '--quick', '--one-shape', *limit, '--arch', '80', '90',
               '--dtype', 'fp16', '--jobs', '2', '--max-seconds', '60', '--write', str(table)]
    run = subprocess.run(command, cwd=REPO_ROOT, env=compile_env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith('_')]
    assert {row[0] for row in rows} == KERNELS | TABLES | CHUNKED
    tables = [row for row in rows if row[0] in TABLES | CHUNKED]
    assert all(row[-3:-1] == ['-', '-'] and row[-1] == 'ok' for row in tables), tables  # not priced
    rows = [row for row in rows if row[0] in KERNELS]
    # whole attention's launches of both paths and the line backward's of both roles are compiled, and priced part
    # by part (one row per path or role)
    both = [row for row in rows if 'v2h' in row and 'h2v' in row or row[0] == '_line_bwd' and 'both' in row]
    assert both and all(row[-3:-1] == ['-', '-'] and row[-1] == 'ok' for row in both), both
    rows = [row for row in rows if row not in both]
    assert {row[0] for row in rows} == KERNELS
    # one shape per kernel and arch: a handful of specializations each (criss-cross attention's row and column
    # passes, whole attention's paths and roles, the fused linear kernels' forward and two backward roles), not
    # every quick-set shape's
    assert len(rows) <= 2 * 24, len(rows)
    for row in rows:
        per_score, ratio = float(row[-3]), float(row[-2])
        assert per_score > 0 and 0.2 < ratio < 20, row
    page = table.read_text()
    assert '## Key-loop SASS per score' in page
    assert sum(line.startswith('| `_') for line in page.splitlines()) == 2 * len(rows) + len(both) + len(tables)


def test_sass_limits_fail_half_precision_rows_above_them():
    ok = dict(shared=0, registers=32, spill=0, seconds=0.0, async_copies=0)
    desc = dict(kernel='_whole_fwd', arch=90, constexprs=dict(BLOCK_M=64, BLOCK_N=64), options=dict(num_warps=4))
    spec = dict(desc=desc, grid=(1, 1, 1), dtype='bf16')
    cost = dict(ok, sass=dict(all=300), flash=dict(all=100))
    assert tool.sass_ratio(spec, cost) == 3.0
    both_roles = dict(spec, desc=dict(desc, constexprs=dict(desc['constexprs'], ONE_BLOCK=True)))
    assert tool.sass_ratio(both_roles, cost) == 1.5  # a loop of both roles against two of the plain kernel's
    assert tool.per_score(spec, 128) == 0.125
    assert tool.status(spec, cost, 0) == 'ok'  # reported only
    limited = dict(spec, sass_limit=tool.sass_limit(spec))
    assert tool.status(limited, cost, 0) == "key loop 3.00x the plain flash kernel's SASS > 1.6x"
    assert tool.status(limited, dict(cost, sass=dict(all=150)), 0) == 'ok'
    assert tool.sass_limit(dict(spec, dtype='fp32')) == float('inf')
    assert {kernel: tool.sass_limit(dict(spec, desc=dict(desc, kernel=kernel))) for kernel in tool.SASS_LIMITS} == {
        '_whole_fwd': 1.6, '_line_fwd': 1.5, '_whole_bwd': 2.0, '_line_bwd': 2.5}


def _whole(keys=False, v2h=True, h2v=True, own=32, other=64, cols=(32, 16)):
    constexprs = dict(V2H=v2h, H2V=h2v, BLOCK_V=own, BLOCK_H=own, COLS_V=cols[0], COLS_H=cols[1], BLOCK_D=32,
                      BLOCK_DV=32, PRECISION=None, **(dict(KEYS=keys, BLOCK_OTHER=other) if keys else
                                                      dict(BLOCK_N=other)))
    return dict(kernel='_whole_bwd' if keys else '_whole_fwd', module='mmppma.ops.whole.triton_impl',
                constexprs=constexprs, options=dict(num_warps=4), arch=90)


def test_rows_are_priced_against_the_flash_variant_that_fits_and_their_real_scores_counted():
    """A row's flash baseline is the ragged (masked) variant when a shape that launches it has a sequence that is
    not a multiple of the other block; the real-score shares count each side's padding by hand."""
    spec = dict(desc=_whole(), dtype='bf16', maps=[(32, 32)])
    assert not tool.ragged(spec)  # 1024 tokens, blocks of 64
    assert tool.ragged(dict(spec, maps=[(32, 32), (50, 84)]))  # 4200 tokens
    # V2H on a 50 x 84 image: own tiles of 32 of the row's 84 columns (3 tiles: 96), keys in 32 columns x 2 rows
    ours, flash = tool.real_shares(dict(spec, maps=[(50, 84)]))
    assert ours == pytest.approx(84 / 96 * 84 / 96 * 1.0) and flash == pytest.approx(4200 / 4224 * 4200 / 4224)
    # the keys' programs of V2H run on the transpose: own tiles along the image's columns (height 50 -> 64)
    keys = dict(desc=_whole(keys=True, v2h=True, h2v=False, own=64, other=64, cols=(16, 32)), dtype='bf16',
                maps=[(50, 84)])
    ours, _ = tool.real_shares(keys)
    assert ours == pytest.approx(50 / 64 * 50 / 64 * 84 / 84)
    # K and V rows per score: (d + dv) bytes over the own tile's rows
    assert tool.kv_bytes(spec) == (32 + 32) * 2 / 32
    line = dict(desc=dict(kernel='_line_fwd', constexprs=dict(COLUMNS=True, BLOCK_M=32, BLOCK_N=32, BLOCK_D=16)),
                dtype='fp16', maps=[(50, 84)])
    assert tool.sequence(line['desc'], 50, 84) == 50 and tool.ragged(line)


def test_two_path_launches_are_priced_path_by_path(monkeypatch):
    """A launch of both paths is compiled as it is but priced as one row per path (its key loops differ in
    tiles); single-path launches are priced as they are."""
    import json
    monkeypatch.setattr(tool, 'desc_key', lambda kernel, desc: json.dumps(desc, sort_keys=True))  # interpreted
    both = dict(desc=_whole(), dtype='bf16', phase='fwd', shapes=['s'], maps=[(32, 32)], grid=(1, 1, 1))
    single = dict(both, desc=_whole(h2v=False))
    assert not tool.priced(both['desc']) and tool.priced(single['desc'])
    parts = tool.paths_apart({tool.desc_key(None, s['desc']): s for s in (both, single)})
    flags = sorted((p['desc']['constexprs']['V2H'], p['desc']['constexprs']['H2V']) for p in parts.values())
    assert flags == [(False, True)]  # the V2H part is the single-path launch already listed
    assert all(tool.priced(p['desc']) and p['maps'] == both['maps'] for p in parts.values())
    # a backward launch of both roles and paths: four parts, the queries' paths then the keys', in the model's order
    roles = dict(_whole(keys=True)['constexprs'], KEYS=False, BOTH=True)
    assert not tool.priced(dict(kernel='_whole_bwd', constexprs=roles))
    split = tool.parts_apart(roles)
    assert [(c['KEYS'], c['BOTH'], c['V2H'], c['H2V']) for c in split] == [
        (False, False, True, False), (False, False, False, True), (True, False, True, False),
        (True, False, False, True)]
    names = [name for name, _ in tool.kernel_model.tiles(dict(kernel='_whole_bwd', constexprs=roles), 32, 32, 1)]
    assert names == ['v2h', 'h2v', 'v2h keys', 'h2v keys']
    # a line backward of both roles: two parts, each the launch's programs and tiles
    line = dict(KEYS=False, BOTH=True, COLUMNS=True, BLOCK_OWN=64, BLOCK_OTHER=64, PRECISION='tf32')
    assert not tool.priced(dict(kernel='_line_bwd', constexprs=line))
    assert [(c['KEYS'], c['BOTH']) for c in tool.parts_apart(line)] == [(False, False), (True, False)]
    tiles = tool.kernel_model.tiles(dict(kernel='_line_bwd', constexprs=line), 100, 7, 3)
    assert tiles == [('lines', (3 * 7 * 2, 2, 64, 64)), ('lines keys', (3 * 7 * 2, 2, 64, 64))]


def test_key_loop_is_the_innermost_loop_holding_an_mma():
    sass_cost = load_tool('sass_cost.py')
    code = [(0x00, 'S2R', 'R0, SR_TID.X'), (0x10, 'HMMA', 'R4, R8, R12, RZ'),  # outside any loop
            (0x20, 'IMAD', 'R1, R1, 0x2, RZ'), (0x30, 'LDG', 'R2, [R4.64]'),  # outer loop: 0x20..0xa0
            (0x40, 'HMMA', 'R4, R8, R12, RZ'), (0x50, 'FFMA', 'R4, R4, R5, R6'),  # key loop: 0x40..0x80
            (0x60, 'MUFU', 'R4, R4'), (0x70, 'F2FP', 'R4, R4, R5'), (0x80, 'BRA', '0x40'),
            (0x90, 'FADD', 'R1, R1, R2'), (0xa0, 'BRA', '0x20'),
            (0xb0, 'FADD', 'R1, R1, R2'), (0xc0, 'BRA', '0xb0'),  # a shorter loop without an MMA
            (0xd0, 'EXIT', '')]
    assert sass_cost.key_loop(code) == (4, 8)
    assert [sass_cost.classify(op) for _, op, _ in code[4:9]] == ['mma', 'fp32', 'mufu', 'conv', 'other']
    assert sass_cost.key_loop(code[5:]) == (6, 7)  # no MMA: the longest loop (FADD, BRA)
    assert sass_cost.loops(code) == [(4, 8), (2, 10), (11, 12)]


def test_key_loop_of_a_kernel_with_two_is_the_longer_and_never_a_stub_past_exit():
    """Two innermost loops with MMAs (one per map a kernel can run): the longer is priced. A retry stub after the
    kernel's EXIT that branches back into a loop is no loop of its own."""
    sass_cost = load_tool('sass_cost.py')
    code = [(0x00, 'HMMA', 'R4, R8, R12, RZ'), (0x10, 'FFMA', 'R4, R4, R5, R6'), (0x20, 'BRA', '0x0'),  # 0..2
            (0x30, 'HMMA', 'R4, R8, R12, RZ'), (0x40, 'FFMA', 'R4, R4, R5, R6'), (0x50, 'HMMA', 'R4, R8, R12, RZ'),
            (0x60, 'BRA', '0x30'),  # 3..6: the longer
            (0x70, 'EXIT', ''), (0x80, 'SYNCS', 'R0'), (0x90, 'BRA', '0x50')]  # a stub back into it
    assert (5, 9) in sass_cost.loops(code)  # holds an MMA and no other loop, and is longer
    assert sass_cost.key_loop(code) == (3, 6)


def test_a_kernel_of_several_key_loops_prices_its_rows_between_by_their_share(monkeypatch):
    """loop_cost gives the next longest key loop as 'side'; the model prices a whole-attention forward path whose
    full key tiles run a loop between the query rows (Cityscapes' stage 4 H2V path: 64 x 32, key tiles of two rows)
    at that loop for its share of the iterations and at 'side' for the rest, and a path without such a loop (key
    tiles with empty places) at its key loop."""
    sass_cost = load_tool('sass_cost.py')
    text = """
        /*0000*/                   HMMA.16816.F32 R4, R8, R12, RZ ;
        /*0010*/                   FADD R4, R4, R5 ;
        /*0020*/               @P0 BRA 0x0 ;
        /*0030*/                   HMMA.16816.F32 R4, R8, R12, RZ ;
        /*0040*/                   FADD R4, R4, R5 ;
        /*0050*/                   FADD R4, R4, R5 ;
        /*0060*/                   FADD R4, R4, R5 ;
        /*0070*/               @P0 BRA 0x30 ;
        /*0080*/                   EXIT ;
    """
    monkeypatch.setattr(sass_cost, 'sass_text', lambda cubin: text)
    cost = sass_cost.loop_cost(b'')
    assert (cost['fp32'], cost['all'], cost['side']['fp32'], cost['side']['all']) == (3, 5, 1, 3)
    c = dict(V2H=False, H2V=True, BLOCK_M=64, COLS_V=64, COLS_H=32, BLOCK_N=64, SCORES_LAYOUT=True)
    desc = dict(kernel='_whole_fwd', constexprs=c)
    share = tool.kernel_model.between_share(64, 32, 64, 2)
    assert share == pytest.approx(1 / 32)
    priced = tool._by_key_rows(desc, 'h2v', cost, 32, 64)
    assert priced['all'] == pytest.approx(share * 5 + (1 - share) * 3) and priced['fp32'] == pytest.approx(
        share * 3 + (1 - share) * 1)
    empty = dict(desc, constexprs=dict(c, COLS_H=21))  # 3 x 21 tiles of 64 places: no full tiles
    assert tool._by_key_rows(empty, 'h2v', cost, 32, 64) is cost
    # the backward's queries: the loop on the own rows (the longest) for its share, the keys' as they are
    c = dict(V2H=True, H2V=True, KEYS=False, BOTH=True, BLOCK_OWN=64, COLS_V=32, COLS_H=32, BLOCK_OTHER=32)
    bwd = dict(kernel='_whole_bwd', constexprs=c)
    share = tool.kernel_model.own_rows_share(128, 64, 64, 1)  # the H2V queries run on the transpose
    assert share == pytest.approx(1 / 128)
    assert tool._by_key_rows(bwd, 'h2v', cost, 64, 128)['all'] == pytest.approx(share * 5 + (1 - share) * 3)
    assert tool._by_key_rows(bwd, 'h2v keys', cost, 64, 128) is cost
    assert tool._by_key_rows(dict(bwd, constexprs=dict(c, KEYS=True, BOTH=False)), 'v2h', cost, 64, 128) is cost


def test_sm_100_loops_are_found_and_its_paired_float32_instructions_count_twice(monkeypatch):
    """sm_100 branches back with a uniform predicate as an operand, and pairs float32 operations (FADD2 / FMUL2 /
    FFMA2): the loop is found as on the other targets, and a paired instruction costs the two it stands for."""
    sass_cost = load_tool('sass_cost.py')
    text = """
        /*0000*/                   S2R R0, SR_TID.X ;                            /* 0x0000000000007919 */
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, RZ ;              /* 0x0000000c0804723c */
        /*0020*/                   FADD2 R4, R4.F32x2.HI_LO, R6.F32x2.HI_LO ;    /* 0x000000060404724b */
        /*0030*/               @P0 FMUL R1, R1, R2 ;                             /* 0x0000000201010220 */
        /*0040*/                   BRA.U !UP0, 0x10 ;                            /* 0xfffffffc08707547 */
        /*0050*/                   EXIT ;                                        /* 0x000000000000794d */
    """
    code = sass_cost.parse(text)
    assert [op for _, op, _ in code] == ['S2R', 'HMMA', 'FADD2', 'FMUL', 'BRA', 'EXIT']
    assert sass_cost.key_loop(code) == (1, 4)
    monkeypatch.setattr(sass_cost, 'sass_text', lambda cubin: text)
    cost = sass_cost.loop_cost(b'')
    assert (cost['mma'], cost['fp32'], cost['other'], cost['all'], cost['inner']) == (1, 3, 1, 5, 0)
    assert cost['tensor'] == 16 * 8 * 16  # one m16 n8 k16 product per warp


def test_a_kernel_without_loops_is_priced_whole(monkeypatch):
    """A kernel whose products are in no loop (straight-line code) costs its every instruction up to its EXIT, once,
    not the branch to itself that pads the code past EXIT."""
    sass_cost = load_tool('sass_cost.py')
    text = """
        /*0000*/                   S2R R0, SR_TID.X ;                            /* 0x0000000000007919 */
        /*0010*/                   HMMA.16816.F32 R4, R8, R12, RZ ;              /* 0x0000000c0804723c */
        /*0020*/                   MUFU.EX2 R4, R4 ;                             /* 0x0000000400047308 */
        /*0030*/                   HMMA.16816.F32 R4, R8, R12, RZ ;              /* 0x0000000c0804723c */
        /*0040*/                   EXIT ;                                        /* 0x000000000000794d */
        /*0050*/                   BRA 0x50 ;                                    /* 0xfffffffc00fc7947 */
    """
    monkeypatch.setattr(sass_cost, 'sass_text', lambda cubin: text)
    assert sass_cost.key_loop(sass_cost.parse(text)) is None  # (the branch to itself past EXIT: no key loop)
    cost = sass_cost.loop_cost(b'')
    assert (cost['mma'], cost['mufu'], cost['all'], cost['tensor']) == (2, 1, 5, 2 * 16 * 8 * 16)


@pytest.mark.slow
def test_half_precision_rows_need_tensor_cores_which_sm_75_lacks(compile_env):
    """--arch takes sm_75 (no launch table: impl='auto' takes the torch path there) besides the tabled sm_120;
    half-precision rows fail on sm_75, where Triton emits no tensor-core instruction, and pass on sm_120, where it
    does."""
    from mmppma.ops import devices
    assert 75 in tool.TARGETS and 75 not in devices.CAPABILITIES and {100, 120} <= set(devices.CAPABILITIES)
    runs = {}
    for arch in (75, 120):
        command = [sys.executable, 'tools/check_kernels.py', '--quick', '--arch', str(arch), '--dtype', 'fp16',
                   '--one-shape', '--kernels', '_line_fwd', '--no-cache']
        runs[arch] = subprocess.run(command, cwd=REPO_ROOT, env=compile_env, capture_output=True, text=True,
                                    timeout=300)
    assert runs[75].returncode == 1 and re.search(r'FAILED _line_fwd sm_75 fp16: (.*; )?no tensor-core instruction',
                                                  runs[75].stdout), runs[75].stdout[-2000:]
    assert runs[120].returncode == 0 and ' 0 failed' in runs[120].stdout, runs[120].stdout[-2000:]
