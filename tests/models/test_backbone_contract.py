"""The contract every backbone keeps (PPMA, RMT, MLLA with both attentions, VMINet), tested once over all of
them: output shapes at odd sizes, out_indices / out norms, argument errors, frozen_stages, norm_eval, with_cp,
drop_path, init_cfg / mmseg's ``pretrained``, bf16 autocast, layer ids for lr decay, and the registry names in
mmengine, mmpretrain, mmdet and mmseg. Family-specific behaviour lives in test_<family>.py."""
import math
import re
import warnings
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.registry import DefaultScope

from mmppma.models import MLLA, PPMA, RMT, VMINet

from .conftest import SMALL_ARCH


@dataclass
class Family:
    cls: type
    arch: dict
    kwargs: dict = field(default_factory=dict)
    #: a keyword with a bad value and the message that must name the choices
    bad_choice: tuple = ()
    #: a per-stage key of ``arch`` (for the wrong-length error)
    per_stage: str = 'embed_dims'

    def build(self, **kwargs) -> nn.Module:
        return self.cls(self.arch, **{**self.kwargs, **kwargs})


MLLA_ARCH = dict(embed_dims=[16, 32, 32, 64], depths=[1, 1, 2, 1], num_heads=[2, 2, 4, 4], mlp_ratio=2.0)
VMINET_ARCH = dict(embed_dims=[8, 16, 24, 32], depths=[1, 1, 2, 1], mlp_ratios=[2, 2, 2, 2], stem_channels=8)
FAMILIES = {
    'PPMA': Family(PPMA, SMALL_ARCH, bad_choice=(dict(mask='cross_scan'), "mask='cross_scan'.*'polyline'")),
    'RMT': Family(RMT, SMALL_ARCH, bad_choice=(dict(mask='polyline'), r'RMT takes no mask.*PPMA\(mask=\.\.\.\)')),
    'MLLA': Family(MLLA, MLLA_ARCH, bad_choice=(dict(mask='softmax'), r"mask='softmax'.*'none', 'polyline'"),
                   per_stage='num_heads'),
    'PPMLA': Family(MLLA, MLLA_ARCH, dict(mask='polyline'), per_stage='num_heads',
                    bad_choice=(dict(mask='PPMLA'), r"mask='PPMLA'.*'none', 'polyline'")),
    'VMINet': Family(VMINet, VMINET_ARCH, dict(img_size=64),
                     bad_choice=(dict(mask='banded'), "mask='banded'.*'none', 'tril'"),
                     per_stage='mlp_ratios'),
}
NAMES = list(FAMILIES)


def stem(model):
    return getattr(model, model.stem_name)


def stages(model):
    return getattr(model, model.stages_name)


def out_size(n: int, stage: int) -> int:
    """Every backbone halves the map twice in its stem and once per later stage, rounding up."""
    for _ in range(stage + 2):
        n = math.ceil(n / 2)
    return n


def checkpoint_spy(monkeypatch) -> list:
    """Record the ``use_reentrant`` of every torch.utils.checkpoint call."""
    calls, real = [], cp.checkpoint

    def spy(fn, *args, **kwargs):
        calls.append(kwargs.get('use_reentrant'))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(cp, 'checkpoint', spy)
    return calls


# ---------------------------------------------------------------- outputs
@pytest.mark.parametrize('name', NAMES)
def test_outputs_at_odd_sizes(name):
    """Batch one at odd sizes down to 1 x 1 (eval), and a training step at another odd size: four NCHW outputs
    of ceil(H / 2^(i+2)) x ceil(W / 2^(i+2)), finite values and gradients."""
    family = FAMILIES[name]
    model = family.build(drop_path_rate=0.1).eval()
    for h, w in ((33, 47), (17, 5), (1, 1)):
        with torch.no_grad():
            outs = model(torch.randn(1, 3, h, w))
        assert [tuple(o.shape) for o in outs] == [(1, c, out_size(h, i), out_size(w, i))
                                                  for i, c in enumerate(family.arch['embed_dims'])]
        assert all(torch.isfinite(o).all() for o in outs)
    model.train()
    sum(o.square().mean() for o in model(torch.randn(2, 3, 29, 23))).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('name', NAMES)
def test_out_indices_and_out_norms(name):
    family = FAMILIES[name]
    model = family.build(out_indices=(1, -1)).eval()
    assert model.out_indices == (1, 3)
    assert model.out_norm_module(0) is None and all(model.out_norm_module(i) is not None for i in (1, 3))
    outs = model(torch.randn(2, 3, 40, 40))
    assert [o.shape[1] for o in outs] == [family.arch['embed_dims'][i] for i in (1, 3)]
    for o in outs:  # a LayerNorm over channels with its initial affine (1, 0)
        torch.testing.assert_close(o.mean(1), torch.zeros_like(o.mean(1)), atol=1e-5, rtol=0)
    raw = family.build(out_norm=False)
    assert all(raw.out_norm_module(i) is None for i in range(4))
    assert not any(k.split('.')[0] in ('norm0', 'norm3', 'outnorm0', 'outnorm3') for k in raw.state_dict())


# ---------------------------------------------------------------- arguments and errors
@pytest.mark.parametrize('name', NAMES)
def test_argument_errors_name_the_fix(name):
    family = FAMILIES[name]
    cls, arch = family.cls, family.arch
    with pytest.raises(ValueError, match=r"arch='huge' is not a known \w+ arch.*base.*small"):
        cls('huge', **family.kwargs)
    with pytest.raises(ValueError, match=r"unknown keys \['window_size'\].*missing keys \[\].*embed_dims"):
        cls(dict(arch, window_size=7), **family.kwargs)
    with pytest.raises(ValueError, match=r"missing keys \['depths'\]"):
        cls({k: v for k, v in arch.items() if k != 'depths'}, **family.kwargs)
    with pytest.raises(ValueError, match=f'{family.per_stage} has 3'):
        cls(dict(arch, **{family.per_stage: arch[family.per_stage][:3]}), **family.kwargs)
    with pytest.raises(TypeError, match='arch must be'):
        cls(3)
    with pytest.raises(ValueError, match='out_indices entry 4'):
        family.build(out_indices=(4, ))
    with pytest.raises(ValueError, match='frozen_stages'):
        family.build(frozen_stages=5)
    with pytest.raises(ValueError, match='in_channels'):
        family.build(in_channels=0)
    with pytest.raises(TypeError, match=rf"{cls.__name__} got unexpected keyword arguments \['drop_rate'\]; "
                       r'its keywords are arch, in_channels, .*drop_path_rate, out_indices'):
        family.build(drop_rate=0.1)
    kwargs, message = family.bad_choice
    with pytest.raises((ValueError, TypeError), match=message):
        family.build(**kwargs)
    model = family.build()
    with pytest.raises(ValueError, match=r'expects images \(B, 3, H, W\).*in_channels'):
        model(torch.randn(1, 4, 16, 16))
    gray = family.build(in_channels=1).eval()
    assert len(gray(torch.randn(1, 1, 16, 16))) == 4


@pytest.mark.parametrize('name', NAMES)
def test_arch_names_any_case_and_short(name):
    cls = FAMILIES[name].cls
    short, long = ('ti', 'tiny') if cls is VMINet else ('t', 'tiny')
    with torch.device('meta'):
        settings = [cls(a, **FAMILIES[name].kwargs).arch_settings for a in (short, long, long.upper())]
    assert settings[0] == settings[1] == settings[2]
    assert {k: settings[0][k] for k in cls.arch_zoo[long]} == dict(cls.arch_zoo[long])


# ---------------------------------------------------------------- training-time options
@pytest.mark.parametrize('name', NAMES)
def test_frozen_stages(name):
    """The stem and stages 0..k-1 (with their output norms) stay in eval mode without gradients after
    train(); their BatchNorm statistics do not move; later stages train. frozen_stages=0 freezes the stem."""
    model = FAMILIES[name].build(frozen_stages=2)
    model.train()
    frozen = [stem(model), stages(model)[0], stages(model)[1], model.out_norm_module(0), model.out_norm_module(1)]
    for m in frozen:
        assert all(not p.requires_grad for p in m.parameters()) and all(not s.training for s in m.modules())
    for m in (stages(model)[2], stages(model)[3], model.out_norm_module(3)):
        assert all(p.requires_grad for p in m.parameters()) and all(s.training for s in m.modules())
    bns = [m for f in frozen for m in f.modules() if isinstance(m, nn.BatchNorm2d)]
    before = [bn.running_mean.clone() for bn in bns]
    model(torch.randn(2, 3, 32, 32))
    assert bns and all(torch.equal(b, bn.running_mean) for b, bn in zip(before, bns))
    stem_only = FAMILIES[name].build(frozen_stages=0).train()
    assert not any(p.requires_grad for p in stem(stem_only).parameters())
    assert all(p.requires_grad for p in stages(stem_only).parameters())


@pytest.mark.parametrize('name', NAMES)
def test_norm_eval(name):
    model = FAMILIES[name].build(norm_eval=True).train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and not any(bn.training for bn in bns)
    assert stages(model)[0].blocks[0].training  # everything else trains
    stats = [bn.running_mean.clone() for bn in bns]
    model(torch.randn(2, 3, 32, 32))
    assert all(torch.equal(s, bn.running_mean) for s, bn in zip(stats, bns))
    plain = FAMILIES[name].build().train()
    assert all(m.training for m in plain.modules() if isinstance(m, nn.BatchNorm2d))


@pytest.mark.parametrize('name', NAMES)
def test_with_cp_same_gradients_non_reentrant(name, monkeypatch):
    family = FAMILIES[name]
    plain, ckpt = family.build(), family.build(with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    plain.eval(), ckpt.eval()  # BatchNorm in eval: both see identical statistics
    calls = checkpoint_spy(monkeypatch)
    x = torch.randn(2, 3, 30, 26)
    for model in (plain, ckpt):
        sum(o.square().sum() for o in model(x)).backward()
    assert calls == [False] * sum(family.arch['depths'])
    for (name_, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name_)
    with torch.no_grad():
        ckpt(x)
    assert len(calls) == sum(family.arch['depths'])  # no checkpointing without grad mode


@pytest.mark.parametrize('name', NAMES)
def test_drop_path_linear_over_blocks(name):
    model = FAMILIES[name].build(drop_path_rate=0.3)
    rates = [b.drop_path.drop_prob for stage in stages(model) for b in stage.blocks]
    assert rates == pytest.approx(torch.linspace(0, 0.3, sum(FAMILIES[name].arch['depths'])).tolist())


@pytest.mark.parametrize('name', NAMES)
def test_autocast_bfloat16(name):
    """Mixed precision (the recipes train with AMP): finite outputs and gradients."""
    model = FAMILIES[name].build()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(2, 3, 40, 56))
    sum(o.float().sum() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('name', NAMES)
def test_layer_ids_for_lr_decay(name):
    """Stem 0; block b of stage s 1 + sum(depths[:s]) + b; output norms and the head num_layers - 1; every
    parameter in range."""
    family = FAMILIES[name]
    model = family.build(out_indices=(3, ))
    depths = family.arch['depths']
    n = sum(depths) + 2
    want = {id(p): 0 for p in stem(model).parameters()}
    for s, stage in enumerate(stages(model)):
        want.update({id(p): 1 + sum(depths[:s]) + b for b, block in enumerate(stage.blocks)
                     for p in block.parameters()})
    want.update({id(p): n - 1 for p in model.out_norm_module(3).parameters()})
    for param, p in model.named_parameters():
        got = model.get_layer_depth(f'backbone.{param}', 'backbone.')
        assert got[1] == n and 0 <= got[0] < n, param
        assert got[0] == want.get(id(p), got[0]), param
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (n - 1, n)


# ---------------------------------------------------------------- weights: init_cfg and mmseg's pretrained
ZOO_URIS = ['open-mmlab://resnet50_v1c', 'torchvision://resnet50', 'mmcls://mobilenet_v2']
DEPRECATED = 'pretrained is deprecated, please use "init_cfg" instead'


@pytest.mark.parametrize('name', NAMES)
def test_init_cfg_and_pretrained_load_the_weights(name, tmp_path):
    """``init_cfg=Pretrained`` with a prefix and mmseg's ``pretrained=PATH`` (with its deprecation warning) load
    every tensor exactly; without either, a freshly built model differs."""
    family = FAMILIES[name]
    source = family.build()
    want = source.state_dict()
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in want.items()}}, tmp_path / 'prefixed.pth')
    torch.save(want, tmp_path / 'plain.pth')
    prefixed = family.build(init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'prefixed.pth'),
                                          prefix='backbone.'))
    with pytest.warns(UserWarning, match=DEPRECATED):
        plain = family.build(pretrained=str(tmp_path / 'plain.pth'))
    assert plain.init_cfg == dict(type='Pretrained', checkpoint=str(tmp_path / 'plain.pth'))
    floats = [k for k, v in want.items() if v.is_floating_point() and v.numel() > 1]
    assert any(not torch.equal(plain.state_dict()[k], want[k]) for k in floats)  # freshly initialized
    for model in (prefixed, plain):
        model.init_weights()
        got = model.state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize('name', NAMES)
def test_pretrained_none_uris_and_bad_values(name):
    family = FAMILIES[name]
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no deprecation warning without pretrained
        assert family.build(pretrained=None).init_cfg is None
        init_cfg = dict(type='Pretrained', checkpoint='x.pth', prefix='backbone.')
        assert family.build(init_cfg=init_cfg, pretrained=None).init_cfg == init_cfg
    for uri in ZOO_URIS:  # another architecture's weights from an upstream model zoo
        with pytest.raises(ValueError) as info:
            family.build(pretrained=uri)
        message = str(info.value)
        assert uri in message and 'model.pretrained=None' in message
        assert "init_cfg=dict(type='Pretrained'" in message and '--backbone-only' in message
    with pytest.raises(ValueError, match='both set'):
        family.build(pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='b.pth'))
    with pytest.raises(TypeError, match='pretrained must be'):
        family.build(pretrained=3)


# ---------------------------------------------------------------- registry names in every library
SCOPES = ['mmengine', 'mmpretrain', 'mmdet', 'mmseg']


def scope_registry(scope: str):
    if scope == 'mmengine':
        from mmengine.registry import MODELS
        return MODELS
    pytest.importorskip(f'{scope}.models')
    return pytest.importorskip(f'{scope}.registry').MODELS


@pytest.mark.parametrize('scope', SCOPES)
def test_bare_and_prefixed_names_build_in_every_scope(scope):
    import mmppma  # noqa: F401  (registers the bare names)
    registry = scope_registry(scope)
    with DefaultScope.overwrite_default_scope(scope):
        for family in FAMILIES.values():
            name = family.cls.__name__
            assert registry.get(name) is registry.get(f'mmppma.{name}') is family.cls
            model = registry.build(dict(type=f'mmppma.{name}', arch=family.arch, out_indices=(3, ),
                                        **family.kwargs)).eval()
            assert model(torch.randn(1, 3, 32, 32))[0].shape == (1, family.arch['embed_dims'][-1], 1, 1)


def test_every_registered_backbone_is_in_the_contract():
    """A new backbone registered in mmppma must join FAMILIES."""
    from mmppma.models.backbones.base import StagedBackbone
    from mmppma.registry import MODELS
    registered = {n for n, c in MODELS.module_dict.items() if isinstance(c, type) and issubclass(c, StagedBackbone)}
    assert registered == {f.cls.__name__ for f in FAMILIES.values()}
    assert all(re.fullmatch(r'[A-Z][A-Za-z]+', n) for n in registered)

