"""PPMA / RMT backbone tests. Forward tests use a small custom arch; the named archs are built only for
their parameter counts and key layouts, which are checked against docs/method.md §7 / the release's key lists."""
import math

import pytest
import torch
import torch.nn as nn

from mmppma.models import PPMA, RMT, PPMAClsHead

from ..conftest import fixture_shapes
from .conftest import SMALL_ARCH

# docs/method.md §7: parameter counts with the 1000-class head
PARAM_COUNTS = {
    (PPMA, 'tiny'): 14_335_272, (PPMA, 'small'): 26_969_472, (PPMA, 'base'): 54_158_524,
    (RMT, 'tiny'): 14_334_216, (RMT, 'small'): 26_967_240, (RMT, 'base'): 54_154_896,
}


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def conv_out(n: int) -> int:
    """Output length of a 3x3, stride 2, padding 1 conv."""
    return (n + 2 - 3) // 2 + 1


# ---------------------------------------------------------------- named archs
@pytest.mark.parametrize('cls,arch', list(PARAM_COUNTS))
def test_param_counts_with_head(cls, arch):
    with torch.device('meta'):  # counts only: no need to allocate and initialize 54M parameters
        backbone = cls(arch, out_indices=(3, ), out_norm=False)
        head = PPMAClsHead(1000, in_channels=backbone.embed_dims[-1], loss=nn.Identity())
    assert num_params(backbone) + num_params(head) == PARAM_COUNTS[(cls, arch)]


@pytest.mark.parametrize('letter,arch', [('T', 'tiny'), ('S', 'small'), ('B', 'base')])
def test_backbone_keys_match_release_layout(letter, arch):
    """Every release backbone key exists with the same shape (the head keys are the converter's job)."""
    want = {k: v for k, v in fixture_shapes(f'ppma_{letter}').items() if not k.startswith(('proj.', 'norm.', 'head.'))}
    with torch.device('meta'):
        got = {k: tuple(v.shape) for k, v in PPMA(arch, out_indices=(3, ), out_norm=False).state_dict().items()}
    assert got == want


def test_arch_aliases_and_case():
    with torch.device('meta'):
        a, b, c = PPMA('t'), PPMA('tiny'), PPMA('Tiny')
    assert a.arch_settings == b.arch_settings == c.arch_settings
    assert a.arch_settings['depths'] == [2, 2, 8, 2]


def test_rmt_fixed_decays_follow_reference():
    """RMT decay per stage s, head h: log(1 - 2^(-2 - r_s*h/n_s)), r = 4,4,6,6 (tiny), 5,5,6,6 (base)."""
    for arch, ranges in (('tiny', (4, 4, 6, 6)), ('base', (5, 5, 6, 6))):
        # the named arch's settings with one block per stage: same Relpos buffers, quick to build
        model = RMT(dict(PPMA.arch_zoo[arch], depths=[1, 1, 1, 1]))
        for s, r in enumerate(ranges):
            n = model.arch_settings['num_heads'][s]
            want = torch.tensor([math.log(1 - 2**(-2 - r * h / n)) for h in range(n)])
            torch.testing.assert_close(model.layers[s].Relpos.decay, want.float())


# ---------------------------------------------------------------- arguments and errors
def test_bad_arch_name_lists_valid_ones():
    with pytest.raises(ValueError, match=r"arch='huge'.*base.*small.*tiny"):
        PPMA('huge')


def test_custom_arch_unknown_and_missing_keys():
    with pytest.raises(ValueError, match=r"unknown keys \['window_size'\].*embed_dims"):
        PPMA(dict(SMALL_ARCH, window_size=7))
    arch = dict(SMALL_ARCH)
    del arch['attn_types']
    with pytest.raises(ValueError, match=r"missing keys \['attn_types'\]"):
        PPMA(arch)
    with pytest.raises(ValueError, match='mlp_ratios has 3'):
        PPMA(dict(SMALL_ARCH, mlp_ratios=[2, 2, 2]))
    with pytest.raises(ValueError, match="attn_types entry 'local'"):
        PPMA(dict(SMALL_ARCH, attn_types=['local'] * 4))
    with pytest.raises(ValueError, match='even head dimension'):
        PPMA(dict(SMALL_ARCH, num_heads=[16, 2, 4, 4]))
    with pytest.raises(TypeError, match='arch must be'):
        PPMA(3)


def test_wrong_in_channels_is_a_clear_error():
    model = PPMA(SMALL_ARCH, in_channels=3)
    with pytest.raises(ValueError, match=r"expects images \(B, 3, H, W\).*in_channels"):
        model(torch.randn(1, 4, 16, 16))
    with pytest.raises(ValueError, match='in_channels'):
        PPMA(SMALL_ARCH, in_channels=0)
    gray = PPMA(SMALL_ARCH, in_channels=1).eval()
    assert len(gray(torch.randn(1, 1, 16, 16))) == 4


def test_other_argument_errors():
    with pytest.raises(ValueError, match='out_indices entry 4'):
        PPMA(SMALL_ARCH, out_indices=(4, ))
    with pytest.raises(ValueError, match='frozen_stages'):
        PPMA(SMALL_ARCH, frozen_stages=5)
    with pytest.raises(ValueError, match="mask='cross_scan'"):
        PPMA(SMALL_ARCH, mask='cross_scan')
    with pytest.raises(ValueError, match='attn_form'):
        PPMA(SMALL_ARCH, attn_form='dense')
    with pytest.raises(TypeError, match=r'RMT takes no mask.*PPMA\(mask=\.\.\.\)'):
        RMT(SMALL_ARCH, mask='polyline')  # RMT's mask is fixed
    with pytest.raises(TypeError, match='RMT takes no attn_form'):
        RMT(SMALL_ARCH, attn_form='paper')
    with pytest.raises(TypeError, match=r"PPMA got unexpected keyword arguments \['drop_rate'\]; its keywords are "
                       r'arch, in_channels, mask, attn_form, impl, out_norm, and drop_path_rate, out_indices'):
        PPMA(SMALL_ARCH, drop_rate=0.1)  # not a keyword any backbone shares
    with pytest.raises(TypeError, match='positional'):
        PPMA(SMALL_ARCH, 3, 'polyline', 'release', 'auto', 0.1)  # the keywords after impl are keyword only


def test_shared_keywords_reach_the_base():
    """The keywords every backbone passes on to StagedBackbone land as they do there, RMT's included."""
    model = RMT(SMALL_ARCH, in_channels=1, drop_path_rate=0.3, out_indices=(-1, ), frozen_stages=1, norm_eval=True,
                with_cp=True, out_norm=False)
    assert (model.in_channels, model.out_indices, model.frozen_stages, model.norm_eval) == (1, (3, ), 1, True)
    assert model.mask == 'rmt' and not model.out_norm and not hasattr(model, 'outnorm3')
    assert all(stage.with_cp for stage in model.layers)
    rates = [block.drop_path.drop_prob for stage in model.layers for block in stage.blocks]
    assert rates == pytest.approx(torch.linspace(0, 0.3, sum(SMALL_ARCH['depths'])).tolist())


# ---------------------------------------------------------------- forward
@pytest.mark.parametrize('h,w', [(33, 47), (17, 5), (1, 1), (64, 3)])
def test_forward_any_size_batch_one(h, w):
    model = PPMA(SMALL_ARCH).eval()
    outs = model(torch.randn(1, 3, h, w))
    sizes = [(conv_out(conv_out(h)), conv_out(conv_out(w)))]
    for _ in range(3):
        sizes.append((conv_out(sizes[-1][0]), conv_out(sizes[-1][1])))
    assert [tuple(o.shape) for o in outs] == [(1, c, *s) for c, s in zip(SMALL_ARCH['embed_dims'], sizes)]
    assert all(torch.isfinite(o).all() for o in outs)


def test_out_indices_and_out_norm():
    model = PPMA(SMALL_ARCH, out_indices=(1, -1)).eval()
    assert model.out_indices == (1, 3)
    assert hasattr(model, 'outnorm1') and hasattr(model, 'outnorm3') and not hasattr(model, 'outnorm0')
    assert model.outnorm1.eps == 1e-5
    outs = model(torch.randn(2, 3, 40, 40))
    assert [o.shape[1] for o in outs] == [32, 64]
    for o in outs:  # LayerNorm over channels with the initial affine (1, 0)
        torch.testing.assert_close(o.mean(1), torch.zeros_like(o.mean(1)), atol=1e-5, rtol=0)
    raw = PPMA(SMALL_ARCH, out_indices=(3, ), out_norm=False)
    assert not any(k.startswith('outnorm') for k in raw.state_dict())


@pytest.mark.parametrize('mask', ['polyline', 'shared', 'v2h', 'none', 'rmt'])
def test_mask_variants_forward_backward(mask):
    model = PPMA(SMALL_ARCH, mask=mask, drop_path_rate=0.1)
    outs = model(torch.randn(2, 3, 29, 23))
    sum(o.sum() for o in outs).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    if mask in ('polyline', 'shared', 'v2h'):
        assert model.layers[0].blocks[0].retention.path_embed.dt_bias.grad.abs().sum() > 0


def test_mask_variant_parameters():
    """Table 4: 'shared' has one dt_linear row per block instead of two; 'none'/'rmt' have no decay params."""
    counts = {m: num_params(PPMA(SMALL_ARCH, mask=m)) for m in ('polyline', 'shared', 'v2h', 'none', 'rmt')}
    head_dims = [d // n for d, n in zip(SMALL_ARCH['embed_dims'], SMALL_ARCH['num_heads'])]
    one_row = sum(depth * d for depth, d in zip(SMALL_ARCH['depths'], head_dims))
    decay_params = sum(depth * (2 * n + 2 * d)
                       for depth, n, d in zip(SMALL_ARCH['depths'], SMALL_ARCH['num_heads'], head_dims))
    assert counts['v2h'] == counts['polyline']
    assert counts['polyline'] - counts['shared'] == one_row
    assert counts['polyline'] - counts['none'] == decay_params
    assert counts['rmt'] == counts['none'] == num_params(RMT(SMALL_ARCH))
    rmt_keys = set(RMT(SMALL_ARCH).state_dict())
    assert rmt_keys == set(PPMA(SMALL_ARCH, mask='rmt').state_dict())
    assert {f'layers.{s}.Relpos.decay' for s in range(4)} <= rmt_keys


def test_paper_form_and_reference_impl():
    torch.manual_seed(0)
    model = PPMA(SMALL_ARCH, impl='torch').eval()
    x = torch.randn(1, 3, 20, 28)
    with torch.no_grad():
        fast = model(x)
        ref_model = PPMA(SMALL_ARCH, impl='reference').eval()
        ref_model.load_state_dict(model.state_dict())
        for a, b in zip(fast, ref_model(x)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        paper = PPMA(SMALL_ARCH, attn_form='paper').eval()
        paper.load_state_dict(model.state_dict())
        assert all(torch.isfinite(o).all() for o in paper(x))


# ---------------------------------------------------------------- training-time options
def test_frozen_stages():
    model = PPMA(SMALL_ARCH, frozen_stages=2)
    model.train()
    frozen = [model.patch_embed, model.layers[0], model.layers[1], model.outnorm0, model.outnorm1]
    for m in frozen:
        assert all(not p.requires_grad for p in m.parameters())
        assert all(not sub.training for sub in m.modules())
    for m in (model.layers[2], model.layers[3], model.outnorm2, model.outnorm3):
        assert all(p.requires_grad for p in m.parameters())
        assert all(sub.training for sub in m.modules())
    # frozen BatchNorm statistics do not move in training forward passes
    before = model.layers[0].downsample.norm.running_mean.clone()
    model(torch.randn(2, 3, 32, 32))
    assert torch.equal(before, model.layers[0].downsample.norm.running_mean)
    stem_only = PPMA(SMALL_ARCH, frozen_stages=0)
    stem_only.train()
    assert not any(p.requires_grad for p in stem_only.patch_embed.parameters())
    assert all(p.requires_grad for p in stem_only.layers.parameters())


def test_norm_eval():
    model = PPMA(SMALL_ARCH, norm_eval=True)
    model.train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(not bn.training for bn in bns)
    assert model.layers[0].blocks[0].training  # everything else trains
    stats = [bn.running_mean.clone() for bn in bns]
    model(torch.randn(2, 3, 32, 32))
    assert all(torch.equal(s, bn.running_mean) for s, bn in zip(stats, bns))
    plain = PPMA(SMALL_ARCH)
    plain.train()
    assert all(m.training for m in plain.modules() if isinstance(m, nn.BatchNorm2d))


def test_with_cp_same_result_and_uses_non_reentrant(monkeypatch):
    import mmppma.models.layers.block as block_module
    torch.manual_seed(0)
    plain = PPMA(SMALL_ARCH)
    ckpt = PPMA(SMALL_ARCH, with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    plain.eval(), ckpt.eval()  # BatchNorm in eval: both see identical statistics
    calls = []
    real = block_module.cp.checkpoint

    def spy(fn, *args, **kwargs):
        calls.append(kwargs.get('use_reentrant'))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(block_module.cp, 'checkpoint', spy)
    x = torch.randn(2, 3, 30, 26)
    for model in (plain, ckpt):
        sum(o.square().sum() for o in model(x)).backward()
    assert calls == [False] * sum(SMALL_ARCH['depths'])
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_drop_path_linear_over_blocks():
    model = PPMA(SMALL_ARCH, drop_path_rate=0.3)
    probs = [b.drop_path.drop_prob for stage in model.layers for b in stage.blocks]
    n = len(probs)
    assert probs == pytest.approx([0.3 * i / (n - 1) for i in range(n)])


# ---------------------------------------------------------------- init and loading
def test_release_init():
    torch.manual_seed(0)
    model = PPMA('tiny')
    fc1 = model.layers[3].blocks[0].ffn.fc1  # 1536 x 512: enough samples for the statistics
    assert abs(fc1.weight.std().item() - 0.02) < 0.001 and fc1.weight.abs().max() <= 2.0
    assert fc1.bias.abs().max() == 0
    for m in model.modules():
        if isinstance(m, nn.Linear) and m.bias is not None:
            assert m.bias.abs().max() == 0
        if isinstance(m, nn.LayerNorm):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
    exp_a = torch.cat([b.retention.path_embed.A_log.exp() for s in model.layers for b in s.blocks])
    assert exp_a.min() >= 1.0 and exp_a.max() <= 1.1


def test_layer_scale():
    arch = dict(SMALL_ARCH, layer_scales=[False, False, True, True], layer_scale_init_value=1e-6)
    model = PPMA(arch)
    assert not hasattr(model.layers[1].blocks[0], 'gamma_1')
    assert model.layers[2].blocks[0].gamma_1.shape == (1, 1, 1, 32)
    assert torch.all(model.layers[3].blocks[0].gamma_2 == 1e-6)


def test_pretrained_init_cfg_with_prefix(tmp_path):
    src = PPMA(SMALL_ARCH)
    path = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in src.state_dict().items()}}, path)
    model = PPMA(SMALL_ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix='backbone.'))
    model.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_get_layer_depth():
    model = PPMA(SMALL_ARCH)
    n = sum(SMALL_ARCH['depths']) + 2
    assert model.get_layer_depth('backbone.patch_embed.proj.0.weight', 'backbone.') == (0, n)
    assert model.get_layer_depth('layers.0.blocks.0.ffn.fc1.weight') == (1, n)
    assert model.get_layer_depth('layers.2.blocks.1.pos.conv.weight') == (1 + 1 + 1 + 1, n)
    assert model.get_layer_depth('layers.0.downsample.reduction.weight') == (1, n)
    assert model.get_layer_depth('layers.3.blocks.0.gamma_1') == (5, n)
    assert model.get_layer_depth('outnorm3.weight') == (n - 1, n)
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (n - 1, n)
    # every parameter gets a depth in range
    for name, _ in model.named_parameters():
        layer_id, _ = model.get_layer_depth(name)
        assert 0 <= layer_id < n


@pytest.mark.parametrize('cls', [PPMA, RMT])
def test_autocast_bfloat16(cls):
    """Mixed precision (the recipe trains with AMP): finite outputs and gradients; decays stay float32."""
    model = cls(SMALL_ARCH)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(2, 3, 40, 56))
        if cls is PPMA:
            la, _ = model.layers[0].blocks[0].retention.path_embed(torch.randn(1, 3, 3, 16))
            assert la.dtype == torch.float32
    sum(o.float().sum() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('cls', [PPMA, RMT])
def test_inference_equals_the_recorded_forward(cls):
    """Without autograd the layers work in place and the ops take their inference paths (sliced criss-cross,
    summed-probability whole attention, padded softmax rows); with autograd recording they do not. Both give
    the same outputs, in float64 to rounding, and inference leaves its input unchanged."""
    torch.manual_seed(0)
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
