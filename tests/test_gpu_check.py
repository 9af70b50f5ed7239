"""tools/gpu_check.py, the check a GPU user runs, on the simulated GPU at its tiny shapes: every op with a Triton
kernel against the dense float64 reference, deterministic; one dtype in the default tier, all three in the full."""
import json
import os

import pytest
import torch

from mmppma.ops import IMPLEMENTATIONS

from .conftest import REPO_ROOT

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
if torch.cuda.is_available():
    pytest.skip('a GPU is here: run python tools/gpu_check.py itself', allow_module_level=True)
#: the largest error of a row (float32: of the reference's largest entry; half precision: in relative norm)
LIMITS = {'fp32': 1e-4, 'fp16': 1e-2, 'bf16': 3e-2}


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / 'tools'))
    import gpu_check
    return gpu_check


@pytest.mark.parametrize('cap, dtypes', [(90, ['fp32']), pytest.param(80, list(LIMITS), marks=pytest.mark.heavy)])
def test_every_op_passes_on_the_simulated_gpu(cap, dtypes, gpu_check, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv('MMPPMA_SIMULATE_CUDA', raising=False)
    path = tmp_path / 'rows.json'
    assert gpu_check.main(['--simulate', str(cap), '--dtype', *dtypes, '--json', str(path)]) == 0
    result = json.loads(path.read_text())
    assert result['device'].startswith(f'simulated sm_{cap}') and result['speed'] == []
    kernels = {op for op, impls in IMPLEMENTATIONS.items() if 'triton' in impls}
    assert sorted((row['op'], row['dtype']) for row in result['checks']) == sorted(
        (op, dtype) for op in kernels for dtype in dtypes)
    for row in result['checks']:
        assert row['reference'] == 'reference' and row['deterministic'] and row['finite'] and row['ok'], row
        assert max(row['out_error'], row['grad_error']) <= LIMITS[row['dtype']], row
    out = capsys.readouterr().out
    assert 'speed: not measured (simulated device)' in out
    assert f'{len(result["checks"])} of {len(result["checks"])} rows passed' in out
    assert 'MMPPMA_SIMULATE_CUDA' not in os.environ  # restored for the caller


def test_gpu_shape_options_are_refused_on_the_simulated_gpu(gpu_check):
    with pytest.raises(SystemExit, match='--simulate runs tiny shapes'):
        gpu_check.main(['--simulate', '90', '--shapes', 'cls_224'])


def test_quick_checks_the_tiny_models_stages_and_times_them_at_the_configs_batch(gpu_check):
    from mmppma.models.backbones.stages import IMAGES, model_shapes
    args = gpu_check.parse_args(['--quick'])
    assert args.repeats == gpu_check.QUICK_REPEATS and args.dtype == ['fp32', 'fp16', 'bf16']
    want = model_shapes(['cls_224'], ['ppma_t', 'rmt_t', 'mlla_t'])
    kinds = {kind for _, kind, _ in want}
    assert kinds == {'cc', 'whole', 'rmt_cc', 'manhattan', 'linear'}  # every op of every attention kind
    checked = gpu_check.shapes_to_check(args)
    timed = gpu_check.shapes_to_check(args, speed=True)
    assert [(label, kind, shape[1:]) for label, kind, shape in checked] == \
        [(label, kind, shape[1:]) for label, kind, shape in want]
    assert {shape[0] for _, _, shape in checked} == {1}
    assert {shape[0] for _, _, shape in timed} == {IMAGES['cls_224'][1]}
    assert gpu_check.shapes_to_check(gpu_check.parse_args(['--quick', '--speed-batch', '8']), speed=True)[0][2][0] == 8
    with pytest.raises(SystemExit):
        gpu_check.parse_args(['--quick', '--shapes', 'upernet_512'])


def test_a_failing_row_prints_fail_with_its_error_and_the_run_goes_on(gpu_check, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv('MMPPMA_SIMULATE_CUDA', raising=False)
    make_case = gpu_check.make_case

    def broken(op, *args, **kwargs):
        if op == 'criss_cross_attention':
            raise RuntimeError('injected failure\nsecond line')
        return make_case(op, *args, **kwargs)

    monkeypatch.setattr(gpu_check, 'make_case', broken)
    monkeypatch.setattr(gpu_check, 'TINY', {'cc': gpu_check.TINY['cc'], 'whole': gpu_check.TINY['whole']})
    path = tmp_path / 'rows.json'
    assert gpu_check.main(['--simulate', '90', '--quick', '--dtype', 'fp32', '--json', str(path)]) == 1
    rows = {row['op']: row for row in json.loads(path.read_text())['checks']}
    assert set(rows) == {'criss_cross_attention', 'ppma_attention', 'polyline_mask_matvec_3d'}
    assert rows['criss_cross_attention']['error'] == 'RuntimeError: injected failure'
    assert not rows['criss_cross_attention']['ok']
    assert rows['ppma_attention']['ok'] and rows['polyline_mask_matvec_3d']['ok']  # the rows after it ran
    out = capsys.readouterr().out
    assert 'criss_cross_attention' in out and 'FAIL  RuntimeError: injected failure' in out
    assert '2 of 3 rows passed; 1 FAILED' in out


def test_guarded_speed_rows_report_their_error(gpu_check):
    def speed_row(*args):
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')

    row, message = gpu_check.guarded(speed_row, dict(op='x', dtype='bf16'))
    error = 'OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB'
    assert row == dict(op='x', dtype='bf16', ok=False, error=error)
    assert message == row['error']
    assert gpu_check.guarded(lambda: dict(ms_fwd=1.0), {}) == (dict(ok=True, ms_fwd=1.0), '')


def test_gpu_report_runs_the_quick_check_then_the_model_benchmark(gpu_check, tmp_path, monkeypatch):
    """tools/gpu_report.sh with a stand-in interpreter: the commands it runs, in order, are ones the tools accept."""
    import shlex
    import subprocess
    import sys
    log = tmp_path / 'calls'
    fake = tmp_path / 'python'
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    for name in ('PPMA.py', 'RMT.py'):  # --release-dir wants the release's two model files there
        (tmp_path / name).write_text('')
    env = dict(os.environ, PYTHON=str(fake), RELEASE_DIR=str(tmp_path))
    done = subprocess.run(['bash', str(REPO_ROOT / 'tools' / 'gpu_report.sh'), str(tmp_path / 'out')], env=env,
                          capture_output=True, text=True, timeout=60)
    calls = [shlex.split(line) for line in log.read_text().splitlines()]
    assert [call[0] for call in calls] == ['-c', 'tools/gpu_check.py', 'tools/benchmark_model.py'], done.stdout
    args = gpu_check.parse_args(calls[1][1:])
    assert args.quick and args.json == str(tmp_path / 'out' / 'gpu_check.json')
    monkeypatch.syspath_prepend(str(REPO_ROOT / 'tools'))
    sys.modules.pop('benchmark_model', None)
    import benchmark_model
    bench = benchmark_model.parse_args(calls[2][1:])
    assert (bench.device, bench.task, bench.mode, bench.batch, bench.shape, bench.amp) == \
        ('cuda', 'classifier', 'infer', 64, [224, 224], 'bf16')
    assert bench.models == ['PPMA', 'RMT'] and bench.impl == ['auto', 'torch'] and bench.release_dir == str(tmp_path)
    assert (tmp_path / 'out' / 'gpu_check.log').exists() and (tmp_path / 'out' / 'benchmark_model.log').exists()
