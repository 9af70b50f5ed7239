"""tools/benchmark_model.py end to end at tiny sizes: every row and ratio it promises, each (model, impl) measured
in the same run and the ratios the quotients of the printed rows (speed itself: docs/benchmarks.md)."""
import math
import re

import pytest

ROW = re.compile(r'^(PPMA|RMT|PPMLA|MLLA)\s+([\w>-]+)\s+(none|default|reduce-overhead)\s+([\d.]+)\s+([\d.]+)\s+'
                 r'([\d.]+)\s+([\d.]+)$', re.M)


def _rows(stdout, mode='none'):
    """(model, impl) -> (time, peak memory) of the rows of compile mode ``mode``."""
    rows = {(m, impl): (float(t), float(mem)) for m, impl, compiled, t, _, mem, _ in ROW.findall(stdout)
            if compiled == mode}
    assert rows, stdout
    for t, mem in rows.values():
        assert t > 0 and math.isfinite(t) and mem >= 0, stdout
    return rows


def _ratio(stdout, prefix):
    """The first ratio of the line ``PREFIX: time 1.2x, ...`` (or ``images/s 1.2x``)."""
    m = re.search(re.escape(prefix) + r': [a-z/]+ ([\d.]+)x', stdout)
    assert m, f'no "{prefix}" line in\n{stdout}'
    return float(m.group(1))


def test_benchmark_model_backbone_every_model_and_impl(run_python):
    out = run_python(['tools/benchmark_model.py', '--shape', '20', '36', '--iters', '1', '--impl', 'auto',
                      'reference'], timeout=600, MMPPMA_IMPL='').stdout
    rows = _rows(out)
    # the table names what 'auto' ran: torch on a CPU
    assert set(rows) == {(m, i) for m in ('PPMA', 'RMT') for i in ('auto->torch', 'reference')}
    assert out.count('stage 4:') == 4  # per-stage breakdown of every run
    for impl, row in (('auto', 'auto->torch'), ('reference', 'reference')):
        assert _ratio(out, f'PPMA / RMT, impl={impl}') == pytest.approx(rows['PPMA', row][0] / rows['RMT', row][0],
                                                                        rel=0.02, abs=0.01)
    assert _ratio(out, 'PPMA impl=auto / impl=reference') == pytest.approx(
        rows['PPMA', 'auto->torch'][0] / rows['PPMA', 'reference'][0], rel=0.02, abs=0.01)


def test_benchmark_model_linear_attention_models_with_an_optimizer_step(run_python):
    """PPMLA and MLLA run as the others do; --optimizer adds AdamW to the training step."""
    out = run_python(['tools/benchmark_model.py', '--models', 'PPMLA', 'MLLA', '--shape', '32', '32', '--batch', '2',
                      '--iters', '1', '--impl', 'torch', '--optimizer'], timeout=600).stdout
    assert set(_rows(out)) == {('PPMLA', 'torch'), ('MLLA', 'torch')}
    assert 'training step with AdamW' in out and 'stage' not in out.split('backbone (tiny)')[1]


@pytest.mark.heavy
@pytest.mark.slow(minutes=10)
def test_benchmark_model_compile_modes_in_one_run(run_python):
    """--compile none default: every model in each mode, the compiled rows' first step (the compile) longer than a
    step, and each model's compiled against eager ratio the quotient of its rows."""
    out = run_python(['tools/benchmark_model.py', '--models', 'PPMA', 'RMT', '--compile', 'none', 'default',
                      '--shape', '32', '32', '--batch', '2', '--iters', '1', '--impl', 'torch', '--no-stages'],
                     timeout=3000).stdout
    eager, compiled = _rows(out), _rows(out, 'default')
    assert set(eager) == set(compiled) == {('PPMA', 'torch'), ('RMT', 'torch')}
    for name in ('PPMA', 'RMT'):
        want = eager[name, 'torch'][0] / compiled[name, 'torch'][0]
        assert _ratio(out, f'{name} impl=torch: compile=default / eager') == pytest.approx(want, rel=0.02, abs=0.01)
    first = {m: float(f) for m, _, mode, *_, f in ROW.findall(out) if mode == 'default'}
    assert all(first[name] > compiled[name, 'torch'][0] for name in ('PPMA', 'RMT')), out


def test_benchmark_model_mask_rcnn_step(run_python, mmdet_ready):
    out = run_python(['tools/benchmark_model.py', '--task', 'mask_rcnn', '--models', 'PPMA', '--shape', '64',
                      '96', '--batch', '2', '--iters', '1', '--impl', 'torch', '--no-stages'],
                     timeout=600).stdout
    assert set(_rows(out)) == {('PPMA', 'torch')}
    assert 'mask_rcnn (tiny), input 2x3x64x96, training step' in out
    assert 'stage' not in out.split('mask_rcnn (tiny)')[1]


STAND_IN = '''import torch
import torch.nn as nn


class _Trunk(nn.Module):  # a release model's stand-in: only its forward_features is timed (milliseconds of matmuls)
    def __init__(self):
        super().__init__()
        self.conv, self.weight = nn.Conv2d(3, {channels}, 3, 2, 1), nn.Parameter(torch.randn(256, 256) / 16)

    def forward_features(self, x):
        y = self.conv(x).flatten(1)[:, :256].repeat(128, 1)
        for _ in range(8):
            y = torch.tanh(y @ self.weight)
        return y


def {factory}T(args):
    return _Trunk()
'''


@pytest.mark.heavy
@pytest.mark.slow
def test_benchmark_model_inference_rounds_against_release_models(run_python, tmp_path):
    """--release-dir times DIR/PPMA.py's and RMT.py's forward_features in the same run, best of --rounds; --amp bf16
    prints each run's error against float32."""
    (tmp_path / 'PPMA.py').write_text(STAND_IN.format(channels=8, factory='PPMAViT_'))
    (tmp_path / 'RMT.py').write_text(STAND_IN.format(channels=4, factory='RMT_'))
    out = run_python(['tools/benchmark_model.py', '--mode', 'infer', '--task', 'classifier', '--shape', '20', '36',
                      '--batch', '2', '--iters', '1', '--rounds', '2', '--release-dir', str(tmp_path), '--profile',
                      '--amp', 'bf16'],
                     timeout=600, MMPPMA_IMPL='').stdout
    rows = _rows(out)
    assert set(rows) == {(m, i) for m in ('PPMA', 'RMT') for i in ('auto->torch', 'release')}
    assert 'wall clock, best of 2 round(s)' in out
    assert out.count('round 2:') == 4 and out.count('rounds, images/s:') == 4
    for ours in ('PPMA', 'RMT'):
        for theirs in ('PPMA', 'RMT'):
            assert _ratio(out, f'{ours} impl=auto / release {theirs}') == pytest.approx(
                rows[theirs, 'release'][0] / rows[ours, 'auto->torch'][0], rel=0.02, abs=0.01)
    assert out.count('per-op profile,') == 4 and 'aten::' in out
    errors = re.findall(r'bf16 outputs against float32: max abs error ([\d.e+-]+), relative \(norm\) error ([\d.e+-]+)',
                        out)
    assert len(errors) == 4 and all(0 < float(rel) < 0.05 for _, rel in errors), out


def test_benchmark_model_training_step_against_a_release_model(run_python, tmp_path):
    """In training mode too, one run times our trunk's and the release's forward_features' forward + backward."""
    (tmp_path / 'RMT.py').write_text(STAND_IN.format(channels=4, factory='RMT_'))
    out = run_python(['tools/benchmark_model.py', '--task', 'classifier', '--models', 'RMT', '--shape', '20', '36',
                      '--iters', '1', '--no-stages', '--release-dir', str(tmp_path)], timeout=300,
                     MMPPMA_IMPL='').stdout
    rows = _rows(out)
    assert set(rows) == {('RMT', 'auto->torch'), ('RMT', 'release')} and 'training step' in out
    assert _ratio(out, 'RMT impl=auto / release RMT') == pytest.approx(
        rows['RMT', 'release'][0] / rows['RMT', 'auto->torch'][0], rel=0.02, abs=0.01)


@pytest.mark.parametrize('args, messages', [
    (['--impl', 'torch', 'torch'], ['twice']), (['--compile', 'none', 'none'], ['--compile', 'twice']),
    (['--compile', 'max-autotune'], ["invalid choice: 'max-autotune'"]),
    (['--mode', 'infer', '--optimizer'], ['--mode train']),
    (['--task', 'classifier', '--models', 'MLLA', '--release-dir', 'DIR'], ['PPMA and RMT']),
    (['--release-dir', 'DIR'], ['--task classifier']),
    (['--mode', 'infer', '--task', 'classifier', '--release-dir', 'DIR'], ['PPMA.py', 'RMT.py'])])
def test_benchmark_model_argument_errors(args, messages, run_python, tmp_path):
    """A repeated impl or compile mode, an unknown compile mode, --optimizer outside training; --release-dir needs the
    classifier task, PPMA or RMT, and DIR/PPMA.py, DIR/RMT.py."""
    proc = run_python(['tools/benchmark_model.py'] + [str(tmp_path) if a == 'DIR' else a for a in args], check=False)
    assert proc.returncode == 2 and all(m in proc.stderr for m in messages), proc.stderr
