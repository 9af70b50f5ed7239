"""What is PPMA's and RMT's own (the contract every backbone keeps: test_backbone_contract.py): parameter counts,
FLOPs and key layouts of the named archs; the mask variants and forms; init, layer scale and inference."""
import math

import pytest
import torch
import torch.nn as nn

from mmppma.models import PPMA, RMT, PPMAClsHead
from mmppma.models.flops import count_flops

from ..conftest import fixture_shapes
from .conftest import SMALL_ARCH, Classifier, num_params

MASKS = ['polyline', 'shared', 'none', 'rmt']
#: paper Table 4's variants as (mask, form)
VARIANTS = [(mask, 'release') for mask in MASKS] + [('polyline', 'v2h')]
# docs/method.md §7: parameter counts with the 1000-class head
PARAM_COUNTS = {
    (PPMA, 'tiny'): 14_335_272, (PPMA, 'small'): 26_969_472, (PPMA, 'base'): 54_158_524,
    (RMT, 'tiny'): 14_334_216, (RMT, 'small'): 26_967_240, (RMT, 'base'): 54_154_896,
}


def with_head(backbone: PPMA) -> Classifier:
    return Classifier(backbone, PPMAClsHead(1000, in_channels=backbone.embed_dims[-1], loss=nn.Identity()))


@pytest.mark.parametrize('letter,arch', [('T', 'tiny'), ('S', 'small'), ('B', 'base')])
def test_param_counts_and_release_keys(letter, arch):
    """Counts with the head (PPMA, RMT, docs/method.md §7); every release backbone key with its shape (meta device)."""
    want = {k: v for k, v in fixture_shapes(f'ppma_{letter}').items() if not k.startswith(('proj.', 'norm.', 'head.'))}
    with torch.device('meta'):
        for cls in (PPMA, RMT):
            assert num_params(with_head(cls(arch, out_indices=(3, ), out_norm=False))) == PARAM_COUNTS[(cls, arch)]
        got = {k: tuple(v.shape) for k, v in PPMA(arch, out_indices=(3, ), out_norm=False).state_dict().items()}
    assert got == want


def test_tiny_flops_match_paper():
    """Paper Table 1/4: PPMA-T 2.7 GFLOPs at 224x224, mmengine's counter with our attention handles, within 5%."""
    total, by_op = count_flops(with_head(PPMA('tiny', out_indices=(3, ), out_norm=False)).eval(),
                               torch.randn(1, 3, 224, 224))
    assert total == pytest.approx(2.7e9, rel=0.05)
    assert not any('PythonOp' in op and n == 0 for op, n in by_op.items())


def test_attention_flops_are_counted_with_every_mask():
    """Whole attention is counted as q k^T + P v (whole stages at 4x4 and 2x2 tokens)."""
    heads_dims = [(n, c // n) for c, n in zip(SMALL_ARCH['embed_dims'], SMALL_ARCH['num_heads'])]
    want = sum(depth * n * t * t * 2 * d for depth, (n, d), t, kind in
               zip(SMALL_ARCH['depths'], heads_dims, [256, 64, 16, 4], SMALL_ARCH['attn_types']) if kind == 'whole')
    for mask in ('polyline', 'rmt', 'none'):
        _, by_op = count_flops(PPMA(SMALL_ARCH, mask=mask).eval(), torch.randn(1, 3, 64, 64))
        assert by_op['PythonOp.WholeAttentionForFlops'] == want, mask


def test_rmt_fixed_decays_follow_reference():
    """RMT decays log(1 - 2^(-2 - r_s*h/n_s)) < 0 (docs/method.md §6), r_s = 4,4,6,6 (tiny), 5,5,6,6 (base)."""
    for arch, ranges in (('tiny', (4, 4, 6, 6)), ('base', (5, 5, 6, 6))):
        # the named arch's settings with one block per stage: same Relpos buffers, quick to build
        model = RMT(dict(PPMA.arch_zoo[arch], depths=[1, 1, 1, 1]))
        for s, r in enumerate(ranges):
            n = model.arch_settings['num_heads'][s]
            want = torch.tensor([math.log(1 - 2**(-2 - r * h / n)) for h in range(n)])
            torch.testing.assert_close(model.layers[s].Relpos.decay, want.float())
            assert (model.layers[s].Relpos.decay < 0).all()


def test_argument_errors():
    for kwargs, error, message in (
            (dict(arch=dict(SMALL_ARCH, attn_types=['local'] * 4)), ValueError,
             r"attn_types\[0\]='local'.*'criss_cross', 'whole'"),
            (dict(arch=dict(SMALL_ARCH, num_heads=[16, 2, 4, 4])), ValueError, 'even head dimension'),
            (dict(arch=SMALL_ARCH, form='dense'), ValueError, r"form='dense'.*'release', 'paper', 'v2h'"),
            (dict(arch=SMALL_ARCH, mask='v2h'), ValueError, r"mask='v2h' is not a mask.*mask='polyline', form='v2h'"),
            (dict(arch=SMALL_ARCH, mask='rmt', form='v2h'), ValueError, "form='v2h' applies to a learned mask"),
            (dict(arch=SMALL_ARCH, form='paper'), ValueError,
             r"form='paper'.*stages \[0, 1\] are 'criss_cross'.*attn_types 'whole' in every stage")):
        with pytest.raises(error, match=message):
            PPMA(**kwargs)
    with pytest.raises(TypeError, match='RMT takes no form'):
        RMT(SMALL_ARCH, form='paper')
    with pytest.raises(TypeError, match='positional'):
        PPMA(SMALL_ARCH, 3, 'polyline', 'release', 'auto', 0.1)  # the keywords after impl are keyword only


@pytest.mark.parametrize('mask, form', VARIANTS)
def test_mask_variants_forward_backward(mask, form):
    model = PPMA(SMALL_ARCH, mask=mask, form=form, drop_path_rate=0.1)
    sum(o.sum() for o in model(torch.randn(2, 3, 29, 23))).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    if mask in ('polyline', 'shared'):
        assert model.layers[0].blocks[0].retention.path_embed.dt_bias.grad.abs().sum() > 0


def test_mask_variant_parameters():
    """Table 4: 'shared' has one dt_linear row per block instead of two; 'none'/'rmt' have no decay params."""
    counts = {m: num_params(PPMA(SMALL_ARCH, mask=m)) for m in MASKS}
    head_dims = [d // n for d, n in zip(SMALL_ARCH['embed_dims'], SMALL_ARCH['num_heads'])]
    one_row = sum(depth * d for depth, d in zip(SMALL_ARCH['depths'], head_dims))
    decay_params = sum(depth * (2 * n + 2 * d)
                       for depth, n, d in zip(SMALL_ARCH['depths'], SMALL_ARCH['num_heads'], head_dims))
    assert num_params(PPMA(SMALL_ARCH, form='v2h')) == counts['polyline']
    assert counts['polyline'] - counts['shared'] == one_row
    assert counts['polyline'] - counts['none'] == decay_params
    assert counts['rmt'] == counts['none'] == num_params(RMT(SMALL_ARCH))
    rmt_keys = set(RMT(SMALL_ARCH).state_dict())
    assert rmt_keys == set(PPMA(SMALL_ARCH, mask='rmt').state_dict())
    assert {f'layers.{s}.Relpos.decay' for s in range(4)} <= rmt_keys


def test_paper_form_and_reference_impl():
    model = PPMA(SMALL_ARCH, impl='torch').eval()
    x = torch.randn(1, 3, 20, 28)
    with torch.no_grad():
        ref_model = PPMA(SMALL_ARCH, impl='reference').eval()
        ref_model.load_state_dict(model.state_dict())
        for a, b in zip(model(x), ref_model(x)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        paper = PPMA(dict(SMALL_ARCH, attn_types=['whole'] * 4), form='paper').eval()
        paper.load_state_dict(model.state_dict())
        assert all(torch.isfinite(o).all() for o in paper(x))


def test_release_init():
    model = PPMA('tiny')
    fc1 = model.layers[3].blocks[0].ffn.fc1  # 1536 x 512: enough samples for the statistics
    assert abs(fc1.weight.std().item() - 0.02) < 0.001 and fc1.weight.abs().max() <= 2.0
    for m in model.modules():
        if isinstance(m, nn.Linear) and m.bias is not None:
            assert m.bias.abs().max() == 0
        if isinstance(m, nn.LayerNorm):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
    assert model.outnorm1.eps == 1e-5
    exp_a = torch.cat([b.retention.path_embed.A_log.exp() for s in model.layers for b in s.blocks])
    assert exp_a.min() >= 1.0 and exp_a.max() <= 1.1


def test_layer_scale_and_layer_ids_of_downsample_relpos_and_layer_scale():
    """Layer scales where asked, with their block's layer id; a downsample's is its stage's last block's, Relpos's
    the first's."""
    model = PPMA(dict(SMALL_ARCH, layer_scales=[False, False, True, True], layer_scale_init_value=1e-6))
    assert not hasattr(model.layers[1].blocks[0], 'gamma_1')
    assert model.layers[2].blocks[0].gamma_1.shape == (1, 1, 1, 32)
    assert torch.all(model.layers[3].blocks[0].gamma_2 == 1e-6)
    n = sum(SMALL_ARCH['depths']) + 2
    assert model.get_layer_depth('layers.0.downsample.reduction.weight') == (1, n)
    assert model.get_layer_depth('layers.2.downsample.reduction.weight') == (4, n)
    assert model.get_layer_depth('layers.2.Relpos.decay') == (3, n)
    assert model.get_layer_depth('layers.3.blocks.0.gamma_1') == (5, n)


@pytest.mark.parametrize('cls', [PPMA, RMT])
def test_inference_equals_the_recorded_forward(cls):
    """Under inference_mode the in-place layers and inference paths equal the recorded forward, input unchanged."""
    model = cls(SMALL_ARCH, impl='torch').double().eval()
    x = torch.randn(2, 3, 72, 40, dtype=torch.float64)
    want = model(x.clone().requires_grad_())
    assert all(o.requires_grad for o in want)
    kept = x.clone()
    with torch.inference_mode():
        got = model(x)
    assert torch.equal(x, kept)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-12)
