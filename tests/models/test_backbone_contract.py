"""The contract every backbone keeps (PPMA, RMT, MLLA with both masks, VMINet), tested once over all of them: outputs,
arguments, training options, layer ids, init_cfg / mmseg's ``pretrained``, registry names in every library."""
import re
import warnings

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.registry import DefaultScope

from .conftest import FAMILIES, out_size

NAMES = list(FAMILIES)


def parts(model):
    """The stem and the stages."""
    return getattr(model, model.stem_name), getattr(model, model.stages_name)


@pytest.mark.parametrize('name', NAMES)
def test_outputs_at_odd_sizes(name):
    """Eval at batch 1 and odd sizes down to 1 x 1, a training step: NCHW outputs of ceil(H / 2^(i+2)), finite."""
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


@pytest.mark.parametrize('name', NAMES)
def test_argument_errors_name_the_fix(name):
    family = FAMILIES[name]
    cls, arch, kwargs = family.cls, family.arch, family.kwargs
    for bad, message in (('huge', r"arch='huge' is not a known \w+ arch.*base.*small"),
                         (dict(arch, window_size=7), r"unknown keys \['window_size'\].*missing keys \[\].*embed_dims"),
                         ({k: v for k, v in arch.items() if k != 'depths'}, r"missing keys \['depths'\]"),
                         (dict(arch, **{family.per_stage: arch[family.per_stage][:3]}), f'{family.per_stage} has 3')):
        with pytest.raises(ValueError, match=message):
            cls(bad, **kwargs)
    with pytest.raises(TypeError, match='arch must be'):
        cls(3)
    for bad, message in ((dict(out_indices=(4, )), 'out_indices entry 4'), (dict(frozen_stages=5), 'frozen_stages'),
                         (dict(in_channels=0), 'in_channels'), family.bad_choice):
        with pytest.raises((ValueError, TypeError), match=message):
            family.build(**bad)
    with pytest.raises(TypeError, match=rf"{cls.__name__} got unexpected keyword arguments \['drop_rate'\]; "
                       r'its keywords are arch, in_channels, .*drop_path_rate, out_indices'):
        family.build(drop_rate=0.1)
    with pytest.raises(ValueError, match=r'expects images \(B, 3, H, W\).*in_channels'):
        family.build()(torch.randn(1, 4, 16, 16))
    assert len(family.build(in_channels=1).eval()(torch.randn(1, 1, 16, 16))) == 4


@pytest.mark.parametrize('name, key, new', [('PPMA', 'attn_form', 'form'), ('MLLA', 'attn', 'mask'),
                                            ('VMINet', 'mask', 'context_mask')])
def test_a_config_with_another_name_for_the_variant_switch_fails_naming_it(name, key, new):
    from mmengine.registry import MODELS
    with pytest.raises(TypeError, match=rf"unexpected keyword arguments \['{key}'\]; its keywords are .*\b{new}\b"):
        MODELS.build(dict(type=f'mmppma.{name}', arch=FAMILIES[name].arch, **{key: 'x'}))


@pytest.mark.parametrize('name', NAMES)
def test_arch_names_any_case_and_short(name):
    cls = FAMILIES[name].cls
    short, long = ('ti', 'tiny') if name == 'VMINet' else ('t', 'tiny')
    with torch.device('meta'):
        settings = [cls(a, **FAMILIES[name].kwargs).arch_settings for a in (short, long, long.upper())]
    assert settings[0] == settings[1] == settings[2]
    assert {k: settings[0][k] for k in cls.arch_zoo[long]} == dict(cls.arch_zoo[long])


@pytest.mark.parametrize('name', NAMES)
def test_frozen_stages_and_norm_eval(name):
    """frozen_stages 2 / 0: stem, stages 0, 1 / the stem frozen (eval, no grad, fixed BN); norm_eval: BNs in eval."""
    family = FAMILIES[name]
    model = family.build(frozen_stages=2).train()
    stem, stages = parts(model)
    frozen = [stem, stages[0], stages[1], model.out_norm_module(0), model.out_norm_module(1)]
    for m in frozen:
        assert all(not p.requires_grad for p in m.parameters()) and all(not s.training for s in m.modules())
    for m in (stages[2], stages[3], model.out_norm_module(3)):
        assert all(p.requires_grad for p in m.parameters()) and all(s.training for s in m.modules())
    norm_eval = family.build(norm_eval=True).train()
    assert parts(norm_eval)[1][0].blocks[0].training
    for model, bns in ((model, [m for f in frozen for m in f.modules() if isinstance(m, nn.BatchNorm2d)]),
                       (norm_eval, [m for m in norm_eval.modules() if isinstance(m, nn.BatchNorm2d)])):
        assert bns and not any(bn.training for bn in bns)
        before = [bn.running_mean.clone() for bn in bns]
        model(torch.randn(2, 3, 32, 32))
        assert all(torch.equal(b, bn.running_mean) for b, bn in zip(before, bns))
    stem, stages = parts(family.build(frozen_stages=0).train())
    assert not any(p.requires_grad for p in stem.parameters()) and all(p.requires_grad for p in stages.parameters())
    assert all(m.training for m in family.build().train().modules() if isinstance(m, nn.BatchNorm2d))


@pytest.mark.parametrize('name', NAMES)
def test_with_cp_same_gradients_non_reentrant(name, monkeypatch):
    family = FAMILIES[name]
    plain, ckpt = family.build(), family.build(with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    plain.eval(), ckpt.eval()  # BatchNorm in eval: both see identical statistics
    calls, real = [], cp.checkpoint

    def spy(fn, *args, **kwargs):
        calls.append(kwargs.get('use_reentrant'))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(cp, 'checkpoint', spy)
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
def test_drop_path_linear_over_blocks_and_bfloat16_autocast(name):
    """Drop path rates linear from 0 over all blocks; under bf16 autocast finite outputs and gradients."""
    model = FAMILIES[name].build(drop_path_rate=0.3)
    rates = [b.drop_path.drop_prob for stage in parts(model)[1] for b in stage.blocks]
    assert rates == pytest.approx(torch.linspace(0, 0.3, sum(FAMILIES[name].arch['depths'])).tolist())
    with torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(2, 3, 40, 56))
    sum(o.float().sum() for o in outs).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize('name', NAMES)
def test_layer_ids_for_lr_decay(name):
    """Stem 0; block b of stage s 1 + sum(depths[:s]) + b; output norms and the head num_layers - 1."""
    family = FAMILIES[name]
    model = family.build(out_indices=(3, ))
    depths = family.arch['depths']
    n = sum(depths) + 2
    stem, stages = parts(model)
    want = {id(p): 0 for p in stem.parameters()}
    for s, stage in enumerate(stages):
        want.update({id(p): 1 + sum(depths[:s]) + b for b, block in enumerate(stage.blocks)
                     for p in block.parameters()})
    want.update({id(p): n - 1 for p in model.out_norm_module(3).parameters()})
    for param, p in model.named_parameters():
        got = model.get_layer_depth(f'backbone.{param}', 'backbone.')
        assert got[1] == n and 0 <= got[0] < n, param
        assert got[0] == want.get(id(p), got[0]), param
    assert model.get_layer_depth('head.fc.weight', 'backbone.') == (n - 1, n)


@pytest.mark.parametrize('name', NAMES)
def test_init_cfg_and_pretrained(name, tmp_path):
    """``init_cfg=Pretrained`` with a prefix and mmseg's deprecated ``pretrained=PATH`` load every tensor exactly;
    ``pretrained=None`` warns nothing; a model-zoo URI, both set or a non-str are errors that say what to do."""
    family = FAMILIES[name]
    want = family.build().state_dict()
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in want.items()}}, tmp_path / 'prefixed.pth')
    torch.save(want, tmp_path / 'plain.pth')
    prefixed = family.build(init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'prefixed.pth'),
                                          prefix='backbone.'))
    with pytest.warns(UserWarning, match='pretrained is deprecated, please use "init_cfg" instead'):
        plain = family.build(pretrained=str(tmp_path / 'plain.pth'))
    assert plain.init_cfg == dict(type='Pretrained', checkpoint=str(tmp_path / 'plain.pth'))
    floats = [k for k, v in want.items() if v.is_floating_point() and v.numel() > 1]
    assert any(not torch.equal(plain.state_dict()[k], want[k]) for k in floats)  # freshly initialized
    for model in (prefixed, plain):
        model.init_weights()
        got = model.state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no deprecation warning without pretrained
        assert family.build(pretrained=None).init_cfg is None
        init_cfg = dict(type='Pretrained', checkpoint='x.pth', prefix='backbone.')
        assert family.build(init_cfg=init_cfg, pretrained=None).init_cfg == init_cfg
    for uri in ('open-mmlab://resnet50_v1c', 'torchvision://resnet50', 'mmcls://mobilenet_v2'):
        with pytest.raises(ValueError) as info:  # another architecture's weights from an upstream model zoo
            family.build(pretrained=uri)
        message = str(info.value)
        assert uri in message and 'model.pretrained=None' in message
        assert "init_cfg=dict(type='Pretrained'" in message and '--backbone-only' in message
    with pytest.raises(ValueError, match='both set'):
        family.build(pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='b.pth'))
    with pytest.raises(TypeError, match='pretrained must be'):
        family.build(pretrained=3)


@pytest.mark.parametrize('scope', ['mmengine', 'mmpretrain', 'mmdet', 'mmseg'])
def test_bare_and_prefixed_names_build_in_every_scope(scope):
    import mmppma  # noqa: F401  (registers the bare names)
    if scope == 'mmengine':
        from mmengine.registry import MODELS as registry
    else:
        pytest.importorskip(f'{scope}.models')
        registry = pytest.importorskip(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        for family in FAMILIES.values():
            name = family.cls.__name__
            assert registry.get(name) is registry.get(f'mmppma.{name}') is family.cls
            model = registry.build(dict(type=f'mmppma.{name}', arch=family.arch, out_indices=(3, ),
                                        **family.kwargs)).eval()
            assert model(torch.randn(1, 3, 32, 32))[0].shape == (1, family.arch['embed_dims'][-1], 1, 1)


def test_every_registered_backbone_is_in_the_contract():
    """A new backbone registered in mmppma (a class of the package; tests/test_family.py registers one of its own)
    must join FAMILIES, as every variant of the family registry."""
    from mmppma.models.backbones.base import StagedBackbone
    from mmppma.models.backbones.family import variants
    from mmppma.registry import MODELS
    registered = {n for n, c in MODELS.module_dict.items()
                  if isinstance(c, type) and issubclass(c, StagedBackbone) and c.__module__.startswith('mmppma.')}
    assert registered == {f.cls.__name__ for f in FAMILIES.values()}
    assert set(FAMILIES) == {v.name for v in variants()}
    assert all(re.fullmatch(r'[A-Z][A-Za-z]+', n) for n in registered)
