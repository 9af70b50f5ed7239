"""Export with dynamic batch, height and width (tools/deployment/pytorch2onnx.py --dynamic): the fixed-grid pools'
run-time form against torch's pools, the chunked decay scan at lengths other than the traced one, and a tiny
UPerNet traced at batch 1, checked in onnxruntime against torch eager at two batches and two sizes; the shipped
UPerNet T configs in the full tier."""
import importlib.util

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma import deploy
from mmppma.deploy.pools import AdaptiveAvgPool2d, AdaptiveMaxPool2d, adaptive_pool2d
from mmppma.ops import decay_scan_1d, export_mode

from ..conftest import REPO_ROOT, load_tool

SIZES = [(8, 8), (7, 13), (5, 3), (1, 9), (16, 11)]  # divisible, overlapping bins, more bins than positions
GRIDS = [1, 2, 3, 6, (2, 5), (None, 3)]


@pytest.mark.parametrize('mode, reference', [('avg', F.adaptive_avg_pool2d), ('max', F.adaptive_max_pool2d)])
def test_adaptive_pool2d_matches_torch(mode, reference):
    for h, w in SIZES:
        x = torch.randn(2, 3, h, w, dtype=torch.float64)
        for grid in GRIDS:
            got = adaptive_pool2d(x, grid, mode)
            want = reference(x, grid)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f'{mode} {grid} at {h}x{w}')


def test_runtime_pool_modules_take_their_form_under_export_only(monkeypatch):
    """Outside an export the modules are torch's pools (not the run-time form); inside, the run-time form."""
    import mmppma.deploy.pools as pool_module
    calls = []
    monkeypatch.setattr(pool_module, 'adaptive_pool2d', lambda *a: calls.append(a[2]) or adaptive_pool2d(*a))
    x = torch.randn(1, 2, 9, 7)
    for cls, reference in ((AdaptiveAvgPool2d, F.adaptive_avg_pool2d), (AdaptiveMaxPool2d, F.adaptive_max_pool2d)):
        pool = cls(3)
        assert torch.equal(pool(x), reference(x, 3))
        with export_mode():
            torch.testing.assert_close(pool(x), reference(x, 3))
    assert calls == ['avg', 'max']


def test_runtime_pools_swap_back():
    """:func:`deploy.runtime_pools` replaces the fixed-grid pools inside the context only (1 x 1 pools stay)."""
    model = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Sequential(nn.AdaptiveAvgPool2d(3)), nn.AdaptiveMaxPool2d(2))
    originals = [model[0], model[1][0], model[2]]
    with deploy.runtime_pools(model) as names:
        assert names == ['1.0', '2']
        assert model[0] is originals[0]
        assert type(model[1][0]) is AdaptiveAvgPool2d and model[1][0].output_size == 3
        assert type(model[2]) is AdaptiveMaxPool2d
    assert [model[0], model[1][0], model[2]] == originals


class Scan(nn.Module):
    """The chunkwise decay scan (PPMLA's masked linear attention runs it along rows and columns), chunk 4."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, L, D)
        return decay_scan_1d(x, -F.softplus(x.mean(-1)), impl='torch', chunk=4)


def test_chunked_scan_dynamic_length(tmp_path):
    """Traced at a line of 8 (two whole chunks, no padding in eager mode), the file pads at run time: lines of
    10 and 3 match the dense reference."""
    pytest.importorskip('onnxruntime', reason='the deploy extra: pip install -e .[deploy]')
    path = str(tmp_path / 'scan.onnx')
    deploy.export_onnx(Scan(), torch.randn(1, 1, 8, 5), path, dynamic=True, optimize=False)
    assert deploy.dynamic_axes(path) == ['batch', 'height', 'width']
    reference = Scan()
    reference.forward = lambda x: decay_scan_1d(x, -F.softplus(x.mean(-1)), impl='reference')
    results = deploy.compare_onnx(path, reference, [torch.randn(b, 1, n, 5) for b, n in ((1, 8), (2, 10), (3, 3))])
    assert max(diff for _, diff in results) <= deploy.TOLERANCE, results


TINY_UPERNET = """
default_scope = 'mmseg'
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(type='SegDataPreProcessor', mean=[0., 0., 0.], std=[1., 1., 1.]),
    backbone=dict(type='mmppma.PPMA', arch={arch!r}, out_indices=(0, 1), out_norm=True),
    decode_head=dict(type='UPerHead', in_channels=[16, 32], in_index=[0, 1], pool_scales=(1, 2, 3, 6),
                     channels=16, num_classes=3, norm_cfg=norm_cfg, align_corners=False),
    train_cfg=dict(), test_cfg=dict(mode='whole'))
"""


@pytest.mark.slow  # tracing with symbolic shapes
@pytest.mark.skipif(importlib.util.find_spec('mmseg') is None, reason='needs mmsegmentation')
def test_tiny_upernet_dynamic_two_batches_two_sizes(tmp_path, capsys):
    """A two-stage PPMA (criss-cross, then whole attention, RoPE in both) under UPerNet's head (pyramid pooling
    to 1, 2, 3, 6), traced at batch 1, 64 x 64: one file, checked by the tool at batch 1 and 2 and at 32 x 96
    (a 4 x 12 last stage, fewer rows than the 6 x 6 pool has bins), then at a third size here."""
    pytest.importorskip('onnxruntime', reason='the deploy extra: pip install -e .[deploy]')
    tool = load_tool('deployment/pytorch2onnx.py')
    arch = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[1, 2], mlp_ratios=[2, 2],
                attn_types=['criss_cross', 'whole'])
    config = tmp_path / 'upernet_tiny.py'
    config.write_text(TINY_UPERNET.format(arch=arch))
    out = tmp_path / 'upernet_tiny.onnx'
    assert tool.main([str(config), '--shape', '64', '64', '--dynamic', '--out', str(out)]) == 0
    printed = capsys.readouterr().out
    assert deploy.dynamic_axes(str(out)) == ['batch', 'height', 'width']
    assert 'decode_head.psp_modules.1.0' in printed  # the 2 x 2 pool, exported in its run-time form
    lines = [line for line in printed.splitlines() if 'max relative difference' in line]
    assert [line.split(' at input ')[1].split(':')[0] for line in lines] == [
        '(1, 3, 64, 64)', '(2, 3, 64, 64)', '(2, 3, 32, 96)']
    torch.manual_seed(0)  # the tool's --seed: the same random weights
    module, _ = deploy.export_module(deploy.build_model(str(config)))
    [(_, diff)] = deploy.compare_onnx(str(out), module, [torch.randn(3, 3, 96, 48)])
    assert diff <= deploy.TOLERANCE


UPERNET_T = [f'upernet_{name}_512x512_160k_ade20k.py' for name in ('ppma_t', 'rmt_t', 'mlla_t', 'ppmla_t', 'vminet_ti')]


@pytest.mark.heavy
@pytest.mark.parametrize('config', UPERNET_T)
def test_shipped_upernet_dynamic(config, tmp_path, capsys):
    """The tool on each family's T UPerNet, random weights, --dynamic traced at batch 1, 512 x 512: checked at
    batch 1 and 2 and at 384 x 640 (minutes each on a CPU)."""
    pytest.importorskip('mmseg')
    pytest.importorskip('onnxruntime', reason='the deploy extra: pip install -e .[deploy]')
    tool = load_tool('deployment/pytorch2onnx.py')
    out = str(tmp_path / 'model.onnx')
    assert tool.main([str(REPO_ROOT / 'configs' / config), '--shape', '512', '512', '--dynamic', '--out', out]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if 'max relative difference' in line]
    print('\n'.join(lines))  # the figures, for docs/deployment.md (pytest -rP shows them)
    assert [line.split(' at input ')[1].split(':')[0] for line in lines] == [
        '(1, 3, 512, 512)', '(2, 3, 512, 512)', '(2, 3, 384, 640)']
