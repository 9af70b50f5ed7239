"""tools/deployment/benchmark_onnx.py runs its cases and files and prints the machine and one table row for each."""
import pytest
import torch

from ..conftest import load_tool

pytest.importorskip('onnxruntime', reason='the deploy extra: pip install -e .[deploy]')


def test_benchmark_table(tmp_path, capsys):
    """A file written before (fixed size, the same random weights, the config changed as ``--cfg-options``
    changes it) and a case exported with dynamic axes, timed in one run; each row's difference from torch within
    1e-4; each file's profile attributes its whole time to the backbone's modules, every part a module of the
    model, and runs each GELU as one fused op."""
    from mmppma import deploy
    config = tmp_path / 'ppma_tiny.py'
    arch = dict(embed_dims=[16], depths=[1], num_heads=[1], mlp_ratios=[2], attn_types=['whole'])
    config.write_text(f"model = dict(type='mmppma.PPMA', arch={arch!r}, out_indices=(0, ))\n")
    tool = load_tool('deployment/benchmark_onnx.py')
    torch.manual_seed(0)
    module, _ = deploy.export_module(deploy.build_model(str(config), cfg_options={'model.arch.embed_dims': [8]}))
    written = tmp_path / 'written.onnx'
    deploy.export_onnx(module, torch.randn(1, 3, 32, 32), str(written))
    assert tool.main(['--file', str(config), '1', '32', '32', str(written), '--case', str(config), '2', '32', '48',
                      '--dynamic', '--iters', '1', '--threads', '1', '--profile',
                      '--cfg-options', 'model.arch.embed_dims=[8]']) == 0
    printed = capsys.readouterr().out
    assert 'machine: ' in printed and 'cores' in printed and 'load average' in printed
    rows = [line for line in printed.splitlines() if line.startswith('| ppma_tiny.py')]
    assert [row.split(' | ')[:3] for row in rows] == [
        ['| ppma_tiny.py (backbone; written.onnx, fixed size)', '1', '32 x 32'],
        ['| ppma_tiny.py (backbone; dynamic)', '2', '32 x 48']]
    assert all(float(row.rstrip(' |').rsplit('| ', 1)[1]) <= 1e-4 for row in rows)
    median, best = (float(rows[0].split(' | ')[i]) for i in (4, 5))
    assert best <= median
    modules = {'.'.join(('model', name)).rstrip('.') for name, _ in deploy.build_model(str(config)).named_modules()}
    profile = deploy.profile_onnx(str(written), {'input': torch.randn(1, 3, 32, 32).numpy()}, threads=1)
    assert profile.total == pytest.approx(sum(profile.ops.values())) == pytest.approx(sum(profile.parts.values()))
    assert 'Gelu' in profile.ops and 'Erf' not in profile.ops  # the GELUs exported as onnxruntime fuses them
    assert set(profile.parts) - {deploy.profile.INSERTED} <= modules and 'model.layers.0' in profile.parts
    assert printed.count('onnxruntime profile of ppma_tiny.py') == 2 and '| model.layers.0 | ' in printed
