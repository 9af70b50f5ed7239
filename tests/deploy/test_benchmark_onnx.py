"""tools/deployment/benchmark_onnx.py runs its cases and prints the machine and one table row per case."""
import pytest

from ..conftest import load_tool

pytest.importorskip('onnxruntime', reason='the deploy extra: pip install -e .[deploy]')


def test_benchmark_table(tmp_path, capsys):
    config = tmp_path / 'ppma_tiny.py'
    arch = dict(embed_dims=[16], depths=[1], num_heads=[1], mlp_ratios=[2], attn_types=['whole'])
    config.write_text(f"model = dict(type='mmppma.PPMA', arch={arch!r}, out_indices=(0, ))\n")
    tool = load_tool('deployment/benchmark_onnx.py')
    assert tool.main(['--case', str(config), '1', '32', '32', '--case', str(config), '2', '32', '48',
                      '--iters', '1', '--threads', '1']) == 0
    printed = capsys.readouterr().out
    assert 'machine: ' in printed and 'cores' in printed and 'load average' in printed
    rows = [line for line in printed.splitlines() if line.startswith('| ppma_tiny.py')]
    assert [row.split(' | ')[1:3] for row in rows] == [['1', '32 x 32'], ['2', '32 x 48']]
    assert all(float(row.rstrip(' |').rsplit('| ', 1)[1]) <= 1e-4 for row in rows)
