"""tools/gpu_check.py, the check a GPU user runs, on the simulated GPU at its tiny shapes: every op with a Triton
kernel against the dense float64 reference, deterministic; one dtype in the default tier, all three in the full.
tools/gpu_report.py, the whole GPU report, rehearsed there: its steps in order, a cut step, the deadline, the
rows file and the summary."""
import json
import os
import re

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


@pytest.fixture
def gpu_report(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / 'tools'))
    import gpu_report
    return gpu_report


def _release(folder):
    """A stand-in for the release's PPMA.py and RMT.py: factories of a model with ``forward_features``."""
    folder.mkdir()
    for name, factory in (('PPMA', 'PPMAViT_T'), ('RMT', 'RMT_T')):
        (folder / f'{name}.py').write_text(
            'import torch\n\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n'
            '        self.conv = torch.nn.Conv2d(3, 8, 4, 4)\n\n    def forward_features(self, x):\n'
            f'        return self.conv(x).mean((-2, -1))\n\n\ndef {factory}(pretrained):\n    return Net()\n')
    return folder


def _records(folder):
    return [json.loads(line) for line in (folder / 'rows.jsonl').read_text().splitlines()]


def test_the_rehearsal_runs_every_step_in_order_and_a_cut_step_leaves_valid_rows(gpu_report, tmp_path, capsys,
                                                                                 monkeypatch):
    """tools/gpu_report.py on the simulated GPU: the compile budget of a real run first, every step in order, the
    training step cut at its limit (after its first step, a compile in progress finishes) with a message, the
    steps after it still run, every line of rows.jsonl is JSON, the summary lists every step with its status."""
    import sys
    monkeypatch.delenv('MMPPMA_SIMULATE_CUDA', raising=False)
    monkeypatch.setattr(sys, 'path', list(sys.path))  # the release's folder goes on it
    for name in ('PPMA', 'RMT'):  # the release's modules, imported by name
        monkeypatch.delitem(sys.modules, name, raising=False)
    out = tmp_path / 'out'
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only waits, and on a loaded machine it thrashes
    try:
        code = gpu_report.main([str(out), '--simulate', '90', '--release-dir', str(_release(tmp_path / 'release')),
                                '--limit', 'cls_train_b64=0'])
    finally:
        torch.set_num_threads(threads)
    for name in ('PPMA', 'RMT'):
        sys.modules.pop(name, None)
    printed = capsys.readouterr().out
    assert code == 1, printed
    records = _records(out)
    names = [name for name, _ in gpu_report.STEPS]
    plan = [r for r in records if r['kind'] == 'plan']
    assert [p['step'] for p in plan] == names
    new = {p['step']: p['triton'] for p in plan}
    assert new['gpu_check'] > 0 and new['ops_800x1344'] > 0 and new['cuda_graphs_b64'] == 0  # step 3's launches
    assert {p['step']: p['inductor_graphs'] for p in plan if p['inductor_graphs']} == {'ops_800x1344': 6,
                                                                                     'cuda_graphs_b64': 2}
    assert re.search(rf'compile budget of a run on sm_90: {sum(new.values())} Triton specializations of our '
                     r'kernels, about \d+ s to compile', printed), printed
    steps = [r for r in records if r['kind'] == 'step']
    assert [s['step'] for s in steps] == names
    status = {s['step']: s['status'] for s in steps}
    assert status == dict({name: 'ok' for name in names}, cls_train_b64='cut'), steps
    cut = steps[names.index('cls_train_b64')]
    assert cut['rows'] == 0 and cut['message'] == 'cut: past its limit of 0 s (after 0 rows)'
    assert '== cls_train_b64: CUT cut: past its limit of 0 s' in printed
    rows = [r for r in records if r['kind'] == 'row']
    by_step = {name: [r for r in rows if r['step'] == name] for name in names}
    assert [(r['op'], r['dtype'], r['ok']) for r in by_step['gpu_check']] == [('path_decay_tables', 'fp32', True)]
    infer = by_step['cls_infer_b64']
    assert [(r['model'], r['impl']) for r in infer] == [('PPMA', 'auto'), ('RMT', 'auto'), ('PPMA', 'torch'),
                                                         ('PPMA (release)', 'release'), ('RMT (release)', 'release')]
    assert all(r['iters'] == 1 and r['ms'] > 0 for r in infer[:3]) and [r['ran'] for r in infer] == ['torch'] * 3 + [
        'release'] * 2
    assert [r['op'] for r in by_step['ops_800x1344']] == ['path_decay_tables', 'ppma_attention (FlexAttention)']
    assert by_step['cuda_graphs_b64'][0]['skipped'] == 'simulated device: eager only'
    assert [r['model'] for r in by_step['linear_train_b64']] == ['PPMLA', 'MLLA']
    assert [r['model'] for r in by_step['backbone_800x1344']] == ['PPMA', 'RMT']
    assert records[-1] == dict(records[-1], kind='summary', steps=status)
    summary = (out / 'summary.txt').read_text().splitlines()
    assert summary[0].startswith('== summary: 8 steps') and printed.rstrip().endswith(summary[-1])
    assert [line.split()[:2] for line in summary[1:9]] == [[s['step'], s['status']] for s in steps]
    compared = [line.split(': time')[0] for line in summary[9:]]  # the model rows measured in pairs
    assert compared == ['cls_infer_b64 PPMA auto / cls_infer_b64 RMT auto',
                        'cls_infer_b64 PPMA auto / cls_infer_b64 PPMA (release) release',
                        'cls_infer_b64 PPMA torch / cls_infer_b64 PPMA (release) release',
                        'linear_train_b64 PPMLA auto / linear_train_b64 MLLA auto',
                        'backbone_800x1344 PPMA auto / backbone_800x1344 RMT auto'], summary


def test_past_the_deadline_the_remaining_steps_are_not_started(gpu_report, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv('MMPPMA_SIMULATE_CUDA', raising=False)
    """The card step's row is taken when the clock is past the run's deadline: the step is cut after it and no
    later step starts; each says why."""
    monkeypatch.setattr(gpu_report, 'compile_plan', lambda cap: [])
    now = [0.0]
    clock = gpu_report.Clock
    monkeypatch.setattr(gpu_report, 'Clock', lambda deadline: clock(deadline, now=lambda: now[0]))
    card = gpu_report.STEP_FUNCTIONS['card']

    def late_card(ctx):
        for row in card(ctx):
            now[0] = 150.0
            yield row

    monkeypatch.setitem(gpu_report.STEP_FUNCTIONS, 'card', late_card)
    out = tmp_path / 'out'
    assert gpu_report.main([str(out), '--simulate', '90', '--deadline', '100']) == 1
    steps = [r for r in _records(out) if r['kind'] == 'step']
    assert [(s['step'], s['status']) for s in steps] == [('card', 'cut')] + [
        (name, 'not started') for name, _ in gpu_report.STEPS[1:]]
    assert steps[0]['rows'] == 1 and 'past its deadline of 100 s' in steps[0]['message']
    assert '== gpu_check: not started (the run is past its deadline of 100 s)' in capsys.readouterr().out


@pytest.mark.parametrize('args, message', [
    ([], 'DIR is required'), (['out', '--limit', 'nope=3'], "--limit takes STEP=SECONDS with STEP one of card"),
    (['out', '--limit', 'gpu_check=soon'], "--limit gpu_check: the seconds must be a number >= 0, not 'soon'"),
    (['out', '--deadline', '0'], '--deadline must be a positive number'),
    (['out', '--plan'], '--plan and the Triton cache options run no step'),
    (['out', '--release-dir', '.'], 'no PPMA.py, RMT.py there')])
def test_gpu_report_refuses_bad_arguments(gpu_report, args, message, capsys):
    with pytest.raises(SystemExit) as raised:
        gpu_report.parse_args(args)
    assert raised.value.code == 2 and message in capsys.readouterr().err
