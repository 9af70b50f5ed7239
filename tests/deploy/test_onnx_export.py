"""ONNX export (mmppma.deploy, tools/deployment/pytorch2onnx.py): every backbone family and variant, exported and
run in onnxruntime, gives torch eager's outputs (separate inference code); shipped classifier configs in the full
tier (segmentors with dynamic sizes: test_dynamic_export.py; the tool's failures: test_tool_failures.py)."""
from dataclasses import replace

import pytest
import torch

from mmppma import deploy
from mmppma.models import MLLA, PPMA, RMT, VMINet
from mmppma.models.layers.conv import conv2d_op
from mmppma.ops import export_mode, exporting, resolve_impl

from ..conftest import REPO_ROOT, load_tool

pytest.importorskip('onnxruntime', reason='the deploy extra: pip install -e .[deploy]')
tool = load_tool('deployment/pytorch2onnx.py')

# two stages: a criss-cross one and a whole-attention one
PPMA_ARCH = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[1, 2], mlp_ratios=[2, 2],
                 attn_types=['criss_cross', 'whole'])
MLLA_ARCH = dict(embed_dims=[16], depths=[1], num_heads=[1])
VMINET_ARCH = dict(embed_dims=[8, 16], depths=[1, 1], mlp_ratios=[2, 2], stem_channels=8)


BACKBONES = {  # VMINet traced at another size than its token-weight tables are trained at: the resize runs too
    'PPMA': lambda: PPMA(PPMA_ARCH, out_indices=(0, 1)), 'RMT': lambda: RMT(PPMA_ARCH, out_indices=(0, 1)),
    'MLLA': lambda: MLLA(MLLA_ARCH, mask='none', out_indices=(0, )),
    'PPMLA': lambda: MLLA(MLLA_ARCH, mask='polyline', out_indices=(0, )),
    'VMINet': lambda: VMINet(VMINET_ARCH, img_size=64, out_indices=(0, 1)),
    **{f'PPMA-{mask}': lambda mask=mask: PPMA(PPMA_ARCH, mask=mask, out_indices=(0, 1)) for mask in ('shared', 'none')},
    'PPMA-v2h': lambda: PPMA(PPMA_ARCH, form='v2h', out_indices=(0, 1)),
    'PPMA-paper': lambda: PPMA(dict(PPMA_ARCH, attn_types=['whole', 'whole']), form='paper', out_indices=(0, 1)),
}


@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.heavy if '-' in n else ()) for n in BACKBONES])
def test_backbone_export_matches_eager(name, tmp_path):
    target = deploy.ONNXRUNTIME_CPU
    if name in ('PPMA', 'RMT'):  # their attention in the export forms that loop over rows and columns (ONNX Scan)
        target = replace(target, loop_tokens=dict(whole=0, criss_cross=0))
    module, kind = deploy.export_module(BACKBONES[name]().eval())
    assert kind == 'backbone'
    x = torch.randn(1, 3, 32, 32)
    path = str(tmp_path / 'model.onnx')
    deploy.export_onnx(module, x, path, target=target, optimize=False)  # the optimizer is onnxscript's, and slow
    [(_, diff)] = deploy.compare_onnx(path, module, [x])
    assert diff <= deploy.TOLERANCE
    import onnx
    opsets = {o.domain: o.version for o in onnx.load(path, load_external_data=False).opset_import}
    assert opsets[''] == target.opset == 18


def test_export_mode_takes_the_torch_path():
    x = torch.zeros(1)
    assert not exporting()
    assert resolve_impl('triton', 'ppma_attention', [x]) == 'triton'  # the interpreter on CPU (conftest)
    with export_mode():
        assert exporting()
        assert resolve_impl('triton', 'ppma_attention', [x]) == 'torch'
        assert resolve_impl('auto', 'ppma_attention', [x]) == 'torch'
        assert resolve_impl('reference', 'ppma_attention', [x]) == 'reference'
    assert not exporting()


def test_gelu_translation(tmp_path):
    """GELU exported by :data:`mmppma.deploy.export.TRANSLATIONS` is torch's (exact and tanh forms), the exact form
    one onnxruntime op (the profile: no Erf); in float64 the file's types check (onnxruntime has no float64 Erf)."""
    import onnx
    module = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.GELU(), torch.nn.Linear(6, 4),
                                 torch.nn.GELU(approximate='tanh')).eval()
    x = torch.randn(1, 3, 8, 8) * 3
    path = str(tmp_path / 'gelu.onnx')
    deploy.export_onnx(module, x, path)
    [(_, diff)] = deploy.compare_onnx(path, module, [x])
    assert diff <= 1e-6
    ops = deploy.profile_onnx(path, {'input': x.numpy()}, threads=1).ops
    assert 'Erf' not in ops and 'Tanh' in ops
    deploy.export_onnx(module.double(), x.double(), path)
    onnx.checker.check_model(onnx.load(path), full_check=True)


def test_fixed_grid_pools():
    """Pools to a fixed grid other than 1 x 1 (UPerNet's pyramid pooling): the ones exported in their run-time
    form."""
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.AdaptiveAvgPool2d(3),
                                torch.nn.AdaptiveMaxPool2d((1, 2)), torch.nn.AvgPool2d(2))
    assert deploy.fixed_grid_pools(model) == ['1', '2']


def test_export_failure_names_the_op(tmp_path):
    """A torch.library op without an ONNX translation: the error names it."""

    class OpaqueConv(torch.nn.Module):

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(4, 3, 3, 3))

        def forward(self, x):
            return conv2d_op(x, self.weight, None, [1, 1], [1, 1], [1, 1], 1)

    with pytest.raises(deploy.ExportError, match='at the operator mmppma::conv2d') as info:
        deploy.export_onnx(OpaqueConv().eval(), torch.randn(1, 3, 8, 8), str(tmp_path / 'model.onnx'))
    assert info.value.op == 'mmppma::conv2d'


SHIPPED = [f'{name}_8xb128_in1k.py' for name in ('ppma_t', 'rmt_t', 'mlla_t', 'ppmla_t', 'vminet_ti')]


@pytest.mark.heavy
@pytest.mark.parametrize('config', SHIPPED)
def test_shipped_classifiers(config, tmp_path):
    """The tool on the shipped ImageNet configs, random weights (minutes each on a CPU; the UPerNet ones:
    test_dynamic_export.py)."""
    pytest.importorskip('mmpretrain')
    out = str(tmp_path / 'model.onnx')
    assert tool.main([str(REPO_ROOT / 'configs' / config), '--shape', '224', '224', '--out', out]) == 0
