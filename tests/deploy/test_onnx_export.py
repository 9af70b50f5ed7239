"""ONNX export (mmppma.deploy, tools/deployment/pytorch2onnx.py): every backbone family and variant, exported and
run in onnxruntime, gives torch eager's outputs (separate inference code); shipped configs in the full tier."""
import importlib.util

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
    **{f'PPMA-{mask}': lambda mask=mask: PPMA(PPMA_ARCH, mask=mask, out_indices=(0, 1))
       for mask in ('v2h', 'shared', 'none')},
    'PPMA-paper': lambda: PPMA(PPMA_ARCH, form='paper', out_indices=(0, 1)),
}


@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.heavy if '-' in n else ()) for n in BACKBONES])
def test_backbone_export_matches_eager(name, tmp_path):
    module, kind = deploy.export_module(BACKBONES[name]().eval())
    assert kind == 'backbone'
    x = torch.randn(1, 3, 32, 32)
    path = str(tmp_path / 'model.onnx')
    deploy.export_onnx(module, x, path, optimize=False)  # the optimizer is onnxscript's, and slow: the tool runs it
    [(_, diff)] = deploy.compare_onnx(path, module, [x])
    assert diff <= deploy.TOLERANCE


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


def test_fixed_grid_pools():
    """Pools to a fixed grid other than 1 x 1 (UPerNet's pyramid pooling) keep height and width static."""
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


@pytest.mark.slow  # tracing with symbolic shapes: about 15 s of CPU
@pytest.mark.skipif(importlib.util.find_spec('mmseg') is None, reason='needs mmsegmentation')
def test_tool_help_and_segmentor_dynamic_two_sizes(tmp_path, capsys):
    """The tool's --help; the tool on an mmseg encoder-decoder config (one criss-cross block, a 1x1 conv head):
    --dynamic, checked at the traced size and a larger one; logits at the input size."""
    with pytest.raises(SystemExit) as info:
        tool.main(['--help'])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    assert '--shape H W' in printed and '--dynamic' in printed and 'checkpoint' in printed
    config = tmp_path / 'seg.py'
    arch = dict(embed_dims=[16], depths=[1], num_heads=[1], mlp_ratios=[2], attn_types=['criss_cross'])
    config.write_text(f"""
default_scope = 'mmseg'
model = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(type='SegDataPreProcessor', mean=[0., 0., 0.], std=[1., 1., 1.]),
    backbone=dict(type='mmppma.PPMA', arch={arch!r}, out_indices=(0, )),
    decode_head=dict(type='FCNHead', in_channels=16, channels=16, num_convs=0, concat_input=False,
                     num_classes=3, norm_cfg=dict(type='SyncBN'), align_corners=False),
    train_cfg=dict(), test_cfg=dict(mode='whole'))
""")
    out = tmp_path / 'seg.onnx'
    assert tool.main([str(config), '--shape', '32', '32', '--batch', '2', '--dynamic', '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    assert 'as a segmentor' in printed
    assert deploy.dynamic_axes(str(out)) == ['batch', 'height', 'width']
    lines = [line for line in printed.splitlines() if 'max relative difference' in line]
    assert [line.split(' at input ')[1].split(':')[0] for line in lines] == ['(2, 3, 32, 32)', '(3, 3, 64, 64)']
    import onnxruntime
    session = onnxruntime.InferenceSession(str(out), providers=['CPUExecutionProvider'])
    [logits] = session.run(None, {'input': torch.randn(1, 3, 48, 80).numpy()})
    assert logits.shape == (1, 3, 48, 80)


SHIPPED = ([(f'{name}_8xb128_in1k.py', 224) for name in ('ppma_t', 'rmt_t', 'mlla_t', 'ppmla_t', 'vminet_ti')] +
           [(f'upernet_{name}_512x512_160k_ade20k.py', 512) for name in ('ppma_t', 'rmt_t', 'mlla_t', 'ppmla_t',
                                                                         'vminet_ti')])


@pytest.mark.heavy
@pytest.mark.parametrize('config, size', SHIPPED)
def test_shipped_configs(config, size, tmp_path):
    """The tool on the shipped ImageNet and UPerNet configs, random weights (minutes each on a CPU)."""
    pytest.importorskip('mmseg' if config.startswith('upernet') else 'mmpretrain')
    out = str(tmp_path / 'model.onnx')
    assert tool.main([str(REPO_ROOT / 'configs' / config), '--shape', str(size), str(size), '--out', out]) == 0
