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
    assert f'{len(result["checks"])} of {len(result["checks"])} checks passed' in out
    assert 'MMPPMA_SIMULATE_CUDA' not in os.environ  # restored for the caller


def test_gpu_shape_options_are_refused_on_the_simulated_gpu(gpu_check):
    with pytest.raises(SystemExit, match='--simulate runs tiny shapes'):
        gpu_check.main(['--simulate', '90', '--shapes', 'cls_224'])
