"""tools/deployment/pytorch2onnx.py fails cleanly: for each step that can go wrong (building the model, the export,
onnxruntime, the comparison with torch) one line on stderr naming the config, the step and the cause, the step's
exit code, and no traceback unless --debug. The models are tiny ones made to fail at that step, registered
through the config's custom_imports as a user's own module would be."""
import pytest

from ..conftest import load_tool

pytest.importorskip('onnxruntime', reason='the deploy extra: pip install -e .[deploy]')
tool = load_tool('deployment/pytorch2onnx.py')

MODELS = '''
import torch
from mmengine.registry import MODELS

from mmppma.models.layers.conv import conv2d_op
from mmppma.ops import exporting


@MODELS.register_module(force=True)
class FailTestOpaque(torch.nn.Module):
    """A conv through a torch.library op without an ONNX translation."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 3, 3, 3))

    def forward(self, x):
        return (conv2d_op(x, self.weight, None, [1, 1], [1, 1], [1, 1], 1), )


@MODELS.register_module(force=True)
class FailTestExportPathDiffers(torch.nn.Module):
    """Exports fine, but its export path computes something else than its eager path."""

    def forward(self, x):
        return (x * 1.01 if exporting() else x, )


@MODELS.register_module(force=True)
class FailTestIdentity(torch.nn.Module):

    def forward(self, x):
        return (x + 1, )
'''


@pytest.fixture
def config_of(tmp_path, monkeypatch):
    """``config_of(model_type)``: the path of a config building that model of :data:`MODELS`."""
    (tmp_path / 'fail_test_models.py').write_text(MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(model_type: str) -> str:
        path = tmp_path / f'{model_type}.py'
        path.write_text(f"custom_imports = dict(imports=['fail_test_models'], allow_failed_imports=False)\n"
                        f"model = dict(type='{model_type}')\n")
        return str(path)

    return make


def run_tool(config: str, capsys, *extra: str):
    code = tool.main([config, '--shape', '8', '8', '--out', config[:-3] + '.onnx', *extra])
    return code, capsys.readouterr().err


def assert_one_line(err: str, config: str, step: str, cause: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f'pytorch2onnx: {config}: {step} failed: ') and cause in lines[0], err
    assert 'Traceback' not in err


def test_help(capsys):
    with pytest.raises(SystemExit) as info:
        tool.main(['--help'])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    assert '--shape H W' in printed and '--dynamic' in printed and 'checkpoint' in printed and '--debug' in printed


def test_build_failure(config_of, capsys):
    config = config_of('NoSuchModel')
    code, err = run_tool(config, capsys)
    assert code == tool.EXIT_CODES['build'] == 5
    assert_one_line(err, config, 'build', 'NoSuchModel')


def test_export_failure(config_of, capsys):
    config = config_of('FailTestOpaque')
    code, err = run_tool(config, capsys)
    assert code == tool.EXIT_CODES['export'] == 3
    assert_one_line(err, config, 'export', 'ONNX export failed at the operator mmppma::conv2d')


def test_onnxruntime_failure(config_of, capsys, monkeypatch):
    """A file whose Reshape holds the traced batch (the form of a failure seen with --dynamic): onnxruntime
    fails at the second batch size."""
    import onnx
    from onnx import TensorProto, helper

    def export_with_fixed_reshape(module, x, path, **kwargs):
        shape = helper.make_tensor('shape', TensorProto.INT64, [4], list(x.shape))
        graph = helper.make_graph(
            [helper.make_node('Reshape', ['input', 'shape'], ['fixed']),
             helper.make_node('Add', ['fixed', 'one'], ['output'])], 'fixed_batch',
            [helper.make_tensor_value_info('input', TensorProto.FLOAT, ['batch', 3, 'height', 'width'])],
            [helper.make_tensor_value_info('output', TensorProto.FLOAT, None)],
            [shape, helper.make_tensor('one', TensorProto.FLOAT, [], [1.0])])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid('', 18)]), path)

    monkeypatch.setattr(tool, 'export_onnx', export_with_fixed_reshape)
    config = config_of('FailTestIdentity')
    code, err = run_tool(config, capsys, '--dynamic')
    assert code == tool.EXIT_CODES['onnxruntime'] == 4
    assert_one_line(err, config, 'onnxruntime', 'at input (2, 3, 8, 8)')
    assert 'Reshape' in err


def test_mismatch(config_of, capsys):
    config = config_of('FailTestExportPathDiffers')
    code, err = run_tool(config, capsys)
    assert code == tool.EXIT_CODES['compare'] == 1
    assert_one_line(err, config, 'compare', 'the largest relative difference 1.0')  # 0.01 max|x| / max|x|
    assert 'exceeds 0.0001' in err


def test_debug_prints_the_traceback(config_of, capsys):
    config = config_of('NoSuchModel')
    code, err = run_tool(config, capsys, '--debug')
    assert code == 5
    assert 'Traceback' in err and err.strip().splitlines()[-1].startswith(f'pytorch2onnx: {config}: build failed')


def test_success_is_quiet_on_stderr(config_of, capsys):
    config = config_of('FailTestIdentity')
    code, err = run_tool(config, capsys)
    assert code == 0 and err == ''
