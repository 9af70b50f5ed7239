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
    assert set(rows) == {'criss_cross_attention', 'ppma_attention', 'path_decay_tables', 'polyline_mask_matvec_3d'}
    assert rows['criss_cross_attention']['error'] == 'RuntimeError: injected failure'
    assert not rows['criss_cross_attention']['ok']
    assert all(rows[op]['ok'] for op in ('ppma_attention', 'path_decay_tables', 'polyline_mask_matvec_3d'))
    out = capsys.readouterr().out
    assert 'criss_cross_attention' in out and 'FAIL  RuntimeError: injected failure' in out
    assert '3 of 4 rows passed; 1 FAILED' in out


def test_guarded_speed_rows_report_their_error(gpu_check):
    def speed_row(*args):
        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')

    row, message = gpu_check.guarded(speed_row, dict(op='x', dtype='bf16'))
    error = 'OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB'
    assert row == dict(op='x', dtype='bf16', ok=False, error=error)
    assert message == row['error']
    assert gpu_check.guarded(lambda: dict(ms_fwd=1.0), {}) == (dict(ok=True, ms_fwd=1.0), '')


def _gpu_report(tmp_path, *args):
    """tools/gpu_report.sh DIR ARGS with a stand-in interpreter that logs its arguments (and fails the gpu_check steps
    with exit 3) and a stand-in ``timeout`` that stops the backbone step as a timeout would (124)."""
    import shutil
    import subprocess
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / 'calls'
    log.unlink(missing_ok=True)
    (bin_dir / 'python').write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in *gpu_check.py*) exit 3;; esac\n')
    (bin_dir / 'timeout').write_text(f'#!/bin/sh\ncase "$*" in *"--task backbone"*) exit 124;; esac\n'
                                     f'exec {shutil.which("timeout")} "$@"\n')
    for tool in ('python', 'timeout'):
        (bin_dir / tool).chmod(0o755)
    env = dict(os.environ, PYTHON=str(bin_dir / 'python'), PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
    done = subprocess.run(['bash', str(REPO_ROOT / 'tools' / 'gpu_report.sh'), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return done, calls


def test_gpu_report_runs_every_step_within_its_budget_and_sums_them_up(gpu_check, tmp_path, monkeypatch):
    """Each part's timeouts sum to at most 9 minutes; each command is one the tools accept; a failing step and a timed
    out one are named in the summary and the steps after them still run."""
    import re
    import shlex
    import sys
    for name in ('PPMA.py', 'RMT.py'):  # --release-dir wants the release's two model files there
        (tmp_path / name).write_text('')
    monkeypatch.syspath_prepend(str(REPO_ROOT / 'tools'))
    sys.modules.pop('benchmark_model', None)
    import benchmark_model
    requirements = (REPO_ROOT / 'requirements.txt').read_text()
    pins = [re.search(rf'^{name}==\S+', requirements, re.M).group(0) for name in ('mmengine', 'mmpretrain')]
    expected = {'1': ['card', 'gpu_check', 'cls_infer_b64', 'cls_train_b64'],
                '2': ['ops_800x1344', 'linear_train_b64', 'backbone_800x1344', 'release_train_b64']}
    runs, checks = [], []
    for part, names in expected.items():
        out = tmp_path / f'out{part}'
        done, calls = _gpu_report(tmp_path, out, *(['--part', part] if part == '2' else []), '--release-dir', tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        steps = re.findall(r'^== (\w+) \(timeout (\d+) s\)', done.stdout, re.M)
        assert [name for name, _ in steps] == names
        assert sum(int(seconds) for _, seconds in steps) <= 9 * 60
        assert f'pip install {" ".join(pins)}' in done.stdout
        assert calls[0] == '-c import mmengine, mmpretrain'  # the check for mmengine and mmpretrain
        if part == '1':  # the card, then the quick check
            assert calls[1].startswith('-c import sys, torch, triton')
        calls = [shlex.split(line) for line in calls[1:]]
        if part == '1':
            args = gpu_check.parse_args(calls[1][1:])
            assert calls[1][0] == 'tools/gpu_check.py' and args.quick and args.json == str(out / 'gpu_check.json')
            calls = calls[2:]
        runs += [benchmark_model.parse_args(call[1:]) for call in calls if call[0] == 'tools/benchmark_model.py']
        checks += [gpu_check.parse_args(call[1:]) for call in calls if call[0] == 'tools/gpu_check.py']
        summary = (out / 'summary.txt').read_text()
        assert re.search(r'^(gpu_check|ops_800x1344) +FAILED .*exit 3', summary, re.M), summary
        assert len(re.findall(r'^\w+ +ok ', summary, re.M)) == 3 - (part == '2'), summary
        assert (out / f'{names[-1]}.log').exists()
        if part == '2':
            # the backbone step timed out before its interpreter ran: its command as the step's header line gives it
            line = re.search(r'^== backbone_800x1344 \(timeout \d+ s\): \S+ (.*)$', done.stdout, re.M).group(1)
            assert re.search(r'^backbone_800x1344 +TIMED OUT', summary, re.M), summary
            assert line.split()[0] == 'tools/benchmark_model.py'
            backbone = benchmark_model.parse_args(line.split()[1:])
            assert (backbone.device, backbone.shape, backbone.batch, backbone.mode, backbone.models) == (
                'cuda', [800, 1344], 2, 'train', ['PPMA', 'RMT'])
    assert [(c.shapes, c.dtype, c.speed_batch) for c in checks] == [(['det_800x1344'], ['bf16'], 2)]
    assert all((r.device, r.task, r.shape, r.amp, r.batch, r.compile) == ('cuda', 'classifier', [224, 224], 'bf16', 64,
                                                                         ['none']) for r in runs)
    assert [(r.mode, r.optimizer, r.models, r.impl, r.release_dir) for r in runs] == [
        ('infer', False, ['PPMA', 'RMT'], ['auto', 'torch'], str(tmp_path)),
        ('train', True, ['PPMA', 'RMT'], ['auto'], None),
        ('train', True, ['PPMLA', 'MLLA'], ['auto'], None),
        ('train', True, ['PPMA', 'RMT'], ['auto'], str(tmp_path))]


@pytest.mark.parametrize('args, message', [(['--frobnicate'], "unknown option '--frobnicate'"), ([], 'usage'),
                                           (['--release-dir'], '--release-dir needs a folder'),
                                           (['--part', '3'], '--part takes 1 or 2')])
def test_gpu_report_refuses_bad_arguments(tmp_path, args, message):
    done, calls = _gpu_report(tmp_path, *([tmp_path / 'out'] if args[:1] != [] else []), *args)
    assert done.returncode != 0 and message in done.stderr and calls == [], done.stderr
