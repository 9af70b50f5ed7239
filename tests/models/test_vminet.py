"""What is VMINet's own (the contract every backbone keeps: test_backbone_contract.py): parameter counts and FLOPs
of the named archs, the block against the release's formulation, resized context weights, options and init."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.models import VMINet
from mmppma.models.backbones import resolve_vminet_arch
from mmppma.models.flops import count_flops
from mmppma.models.layers.vminet import TokenWeights, VMISABlock

from .conftest import VMINET_ARCH, Classifier, num_params, out_size

#: the release's vminet_{Ti,XS,S,B}: long name, stage dims, MLP ratio; our parameter counts with the 1000-class
#: classifier (BN norm3 + Linear) with proj_norm True / False, the release's (M); mmengine's FLOPs (one multiply-add
#: = one FLOP) at 1 x 3 x 224 x 224, classifier included, the paper's (G)
SIZES = {'ti': ('tiny', [24, 48, 96, 192], 2, (2_036_938, 2_032_426), 2.04, 350_389_120, 0.3),
         'xs': ('xsmall', [48, 96, 192, 384], 2, (7_440_370, 7_431_346), 7.44, 1_258_133_248, 1.4),
         's': ('small', [48, 96, 192, 384], 4, (13_347_442, 13_338_418), 13.35, 2_300_915_968, 2.3),
         'b': ('base', [96, 192, 384, 768], 2, (28_387_138, 28_369_090), 28.39, 4_780_609_024, 4.8)}


def classifier(arch: str, **kwargs) -> Classifier:
    """The release's classifier around our backbone: norm3 (BN) -> global average pool -> Linear."""
    return Classifier(VMINet(arch, out_indices=(3, ), out_norm='BN', **kwargs))


@pytest.mark.parametrize('arch', SIZES)
def test_arch_table_and_param_counts_with_classifier(arch):
    long, dims, ratio, params, release_m, _, _ = SIZES[arch]
    settings = resolve_vminet_arch(arch)
    assert settings == resolve_vminet_arch(long) == resolve_vminet_arch(long.upper())
    assert (settings['embed_dims'], settings['mlp_ratios']) == (dims, [ratio] * 4)
    assert (settings['depths'], settings['stem_channels'], settings['kernel_size']) == ([2, 2, 18, 2], 32, 7)
    with torch.device('meta'):
        counts = tuple(num_params(classifier(arch, proj_norm=p)) for p in (True, False))
    assert counts == params
    for count in counts:  # both release revisions
        assert count == pytest.approx(release_m * 1e6, rel=0.01)


@pytest.mark.parametrize('arch', SIZES)
def test_flops_at_224(arch):
    """Measured counts; S and B within 5% of the paper (2.3 / 4.8 G). Ti and XS (paper 0.3 / 1.4 G), with the
    release's own architecture and parameter counts, measure 0.350 / 1.258 G: checked against those only."""
    total, by_op = count_flops(classifier(arch).eval(), torch.randn(1, 3, 224, 224))
    *_, flops, paper_gflops = SIZES[arch]
    assert total == flops
    assert set(by_op) <= {'conv', 'batch_norm', 'matmul', 'linear'}
    if arch in ('s', 'b'):
        assert total == pytest.approx(paper_gflops * 1e9, rel=0.05)


def release_block(block: VMISABlock, x: torch.Tensor, tril: bool) -> torch.Tensor:
    """The release's Block.forward, written out with functional ops on our block's weights (224 input)."""
    u = block.dwconv(x)
    y = F.relu6(block.f1(u)) * block.f2(u)
    b, c, h, w = y.shape
    tokens = y.reshape(b, c, h * w).permute(0, 2, 1)  # (B, N, C)
    if tril:
        tokens = torch.tril(tokens)
    s = F.linear(tokens.permute(0, 2, 1), block.sum.weight).unsqueeze(2)  # (B, C, 1, 1)
    y = block.stack[0] * s.expand(b, c, h, w) + block.stack[1] * y
    return x + block.g(F.relu6(y))


@pytest.mark.parametrize('context_mask', ['tril', 'none'])
def test_block_matches_release_formulation(context_mask):
    block = VMISABlock(6, 2, (7, 5), context_mask=context_mask).double().eval()
    with torch.no_grad():
        block.stack.copy_(torch.tensor([0.7, 1.3]))
        for bn in (block.dwconv.bn, block.g.bn):
            bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2), bn.weight.normal_(), bn.bias.normal_()
    x = torch.randn(2, 6, 7, 5, dtype=torch.float64)
    torch.testing.assert_close(block(x), release_block(block, x, context_mask == 'tril'))


def test_token_weights_resize():
    """At the trained size the table itself; at others h * w weights keeping a constant table's total."""
    weights = TokenWeights((7, 7))
    assert torch.equal(weights.resized(7, 7), weights.weight.t())
    with torch.no_grad():
        weights.weight.fill_(0.5)
    for h, w in ((14, 14), (3, 5), (1, 1), (9, 1), (20, 3)):
        assert weights.resized(h, w).shape == (h * w, 1)
        assert weights.resized(h, w).sum().item() == pytest.approx(0.5 * 49, rel=1e-5)


def test_one_pixel_late_stages():
    """Training at batch 1 with 1-wide late stages, BatchNorm statistics frozen (training BatchNorm needs more than
    one value per channel); the resized context table is trained (eval at odd sizes: the contract's)."""
    model = VMINet(VMINET_ARCH, norm_eval=True).train()
    outs = model(torch.randn(1, 3, 40, 8))
    assert [tuple(o.shape[2:]) for o in outs] == [(out_size(40, i), out_size(8, i)) for i in range(4)] == [
        (10, 2), (5, 1), (3, 1), (2, 1)]
    sum(o.square().mean() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    model.zero_grad()
    sum(o.square().mean() for o in model(torch.randn(2, 3, 97, 131))).backward()
    assert model.stages[2].blocks[1].sum.weight.grad.abs().sum() > 0  # the resized table is trained


def test_context_mask_proj_norm_and_out_norm_options():
    keys = set(VMINet(VMINET_ARCH, proj_norm=True).state_dict())
    assert 'stages.0.1.g.bn.weight' in keys and 'stages.0.1.sum.weight' in keys
    assert not any('.g.bn.' in k for k in VMINet(VMINET_ARCH, proj_norm=False).state_dict())
    a = VMINet(VMINET_ARCH, context_mask='tril').eval()
    b = VMINet(VMINET_ARCH, context_mask='none').eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(a(x)[-1], b(x)[-1])
    # out_norm 'LN' (also True): LayerNorms outnorm{i}; 'BN': BatchNorms norm{i} (the release classifier's)
    with pytest.raises(ValueError, match="out_norm='GN'.*'LN', 'BN'"):
        VMINet(VMINET_ARCH, out_norm='GN')
    assert isinstance(VMINet(VMINET_ARCH, out_indices=(1, )).outnorm1, nn.LayerNorm)
    bn = VMINet(VMINET_ARCH, out_indices=(3, ), out_norm='BN')
    assert isinstance(bn.norm3, nn.BatchNorm2d) and not hasattr(bn, 'outnorm3')
    assert VMINet(VMINET_ARCH, out_norm=True).out_norm == 'LN'
    raw = VMINet(VMINET_ARCH, out_norm=None)
    assert not any('norm' in k.split('.')[0] for k in raw.state_dict())


def test_release_init():
    model = VMINet('xs')
    table = model.stages[0][1].sum.weight  # 1 x 3136
    assert abs(table.std().item() - 0.02) < 0.002 and table.abs().max() <= 2.0  # timm-style absolute bounds
    assert all(torch.equal(b.stack, torch.ones(2)) for s in model.stages for b in s.blocks)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
