"""The timm models against timm's own expectations (the checks of timm's tests/test_models.py, written here for
our models): registration, forward, backward, default cfgs, forward_intermediates and features_only; at small
sizes on CPU, every registered name built, the smallest size of each family run."""
import math
import re
import textwrap
from pathlib import Path

import pytest
import timm
import torch
import yaml

import mmppma.timm_models as tm

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ('ppma', 'rmt', 'mlla', 'ppmla', 'vminet')
SIZES = {'ppma': ('tiny', 'small', 'base'), 'rmt': ('tiny', 'small', 'base'), 'mlla': ('tiny', 'small', 'base'),
         'ppmla': ('tiny', 'small', 'base'), 'vminet': ('tiny', 'xsmall', 'small', 'base')}
NAMES = [f'{family}_{size}' for family in FAMILIES for size in SIZES[family]]
SMALLEST = [f'{family}_{SIZES[family][0]}' for family in FAMILIES]
#: the model index entry of each name with release weights (mmppma/.mim/metafiles)
INDEX = {'ppma_tiny': ('ppma', 'ppma-t'), 'ppma_small': ('ppma', 'ppma-s'), 'ppma_base': ('ppma', 'ppma-b'),
         'mlla_tiny': ('mlla', 'mlla-t'), 'mlla_small': ('mlla', 'mlla-s'), 'mlla_base': ('mlla', 'mlla-b'),
         'vminet_tiny': ('vminet', 'vminet-ti'), 'vminet_xsmall': ('vminet', 'vminet-xs'),
         'vminet_small': ('vminet', 'vminet-s')}


def index_entry(name: str) -> dict:
    family, arch = INDEX[name]
    models = yaml.safe_load((REPO / 'mmppma/.mim/metafiles' / family / 'metafile.yml').read_text())['Models']
    return next(m for m in models if m['Name'] == f'mmppma_{arch}_3rdparty_in1k')


# ---------------------------------------------------------------- registration
def test_every_family_and_size_is_registered():
    for family in FAMILIES:
        assert timm.list_models(f'{family}*') == sorted(f'{family}_{s}' for s in SIZES[family]), family
    ours = [n for n in timm.list_models(pretrained=True) if n.split('.')[0] in NAMES]
    assert ours == sorted(f'{name}.in1k' for name in INDEX)
    for name in INDEX:  # the download is the model index's release file
        assert timm.models.get_pretrained_cfg(f'{name}.in1k').url == index_entry(name)['Weights']


def test_import_registers_with_timm_and_imports_no_downstream_library(run_python):
    code = textwrap.dedent("""
        import sys
        import timm
        assert not timm.list_models('ppma*')
        import mmppma
        print(len(timm.list_models(module='timm_models')), timm.list_models('ppma_t*', pretrained=True))
        print(sorted({m.split('.')[0] for m in sys.modules} & {'mmdet', 'mmseg', 'mmpretrain'}))
    """)
    out = run_python(['-c', code]).stdout.splitlines()
    assert out == [f"{len(NAMES)} ['ppma_tiny.in1k']", '[]']


def test_every_name_builds_with_the_index_parameter_count():
    """timm.create_model builds every name (on the meta device: no memory, no init; the smallest of each family is
    built and run on the CPU below); the parameter counts are the model index's (tools/get_flops.py on the
    mmpretrain classifier, or the release state dicts' totals) and docs/model_zoo.md's timm table's."""
    text = (REPO / 'docs/model_zoo.md').read_text()
    rows = re.findall(r'^\| `(\w+)` \| `?([\w.-]+)`? \| ([\d.]+) M \|', text[text.index('\n## timm'):], re.M)
    assert [row[0] for row in rows] == NAMES
    assert sorted(row[1] for row in rows if row[1] != '-') == sorted(f'{name}.in1k' for name in INDEX)
    for name, _, documented in rows:
        with torch.device('meta'):
            model = timm.create_model(name)
        assert isinstance(model, tm.MMPPMAClassifier) and model.num_classes == 1000, name
        params = sum(p.numel() for p in model.parameters())
        assert f'{params / 1e6:.2f}' == documented, name
        if name in INDEX:
            assert params == index_entry(name)['Metadata']['Parameters'], name


# ---------------------------------------------------------------- timm's test_models.py checks
def test_installed_timm_is_the_pinned_one():
    """The checks below follow the pinned timm's tests/test_models.py."""
    pin = re.search(r'^timm==(\S+)$', (REPO / 'requirements.txt').read_text(), re.M).group(1)
    assert timm.__version__ == pin


@pytest.mark.parametrize('name', SMALLEST)
def test_backward_reaches_every_parameter(name):
    model = timm.create_model(name, num_classes=42).train()
    out = model(torch.randn(2, 3, 32, 48))
    out.mean().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None]
    assert no_grad == [] and out.shape == (2, 42) and not out.isnan().any()


@pytest.mark.parametrize('name', SMALLEST)
def test_forward_default_cfg_and_head_contract(name):
    """Forward (also with grad checkpointing); the default cfg's keys and their meaning: pool_size is the unpooled
    map at input_size (stride 32), the classifier and first conv name parameters; forward_head(pre_logits),
    reset_classifier(0) and (0, '') and num_classes=0, global_pool='' at construction."""
    model = timm.create_model(name).eval()
    cfg = model.default_cfg
    assert cfg['input_size'] == (3, 224, 224) and tuple(cfg['pool_size']) == (7, 7)
    assert model.num_features > 0 and model.head_hidden_size > 0 and model.num_classes == cfg['num_classes'] == 1000
    state = model.state_dict()
    assert f'{cfg["classifier"]}.weight' in state and f'{cfg["first_conv"]}.weight' in state
    x = torch.randn(1, 3, 33, 65)  # maps of 2 x 3
    with torch.no_grad():
        logits = model(x)
        assert logits.shape == (1, 1000) and not logits.isnan().any()
        model.set_grad_checkpointing()
        torch.testing.assert_close(model(x), logits, rtol=1e-4, atol=1e-5)
        feats = model.forward_features(x)
        pre = model.forward_head(feats, pre_logits=True)
        assert feats.shape == (1, model.num_features, 2, 3) and pre.shape == (1, model.head_hidden_size)
        torch.testing.assert_close(model.get_classifier()(pre), logits, rtol=0, atol=0)
        model.reset_classifier(0)
        assert model.num_classes == 0
        torch.testing.assert_close(model(x), pre, rtol=0, atol=0)
        model.reset_classifier(0, '')
        assert model(x).shape == (1, model.head_hidden_size, 2, 3)
        model = timm.create_model(name, num_classes=0, global_pool='').eval()
        assert model(x).shape == (1, model.head_hidden_size, 2, 3)
    with pytest.raises(ValueError, match="global_pool='max'.*'avg' or ''"):
        model.reset_classifier(10, 'max')


@pytest.mark.parametrize('name', SMALLEST)
def test_forward_intermediates_matches_forward_features(name):
    model = timm.create_model(name).eval()
    info = timm.models.FeatureInfo(model.feature_info, len(model.feature_info))
    assert info.channels() == model.backbone.embed_dims and info.reduction() == [4, 8, 16, 32]
    x = torch.randn(1, 3, 65, 47)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
        assert [tuple(t.shape) for t in inter] == [(1, c, math.ceil(65 / r), math.ceil(47 / r))
                                                   for c, r in zip(info.channels(), info.reduction())]
        torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
        torch.testing.assert_close(inter[-1], final, rtol=0, atol=0)
        two = model.forward_intermediates(x, indices=[0, 2], intermediates_only=True)
        for got, want in zip(two, (inter[0], inter[2])):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        nhwc = model.forward_intermediates(x, indices=1, output_fmt='NHWC', intermediates_only=True)
        torch.testing.assert_close(nhwc[0], inter[-1].permute(0, 2, 3, 1), rtol=0, atol=0)
        model.set_grad_checkpointing()
        torch.testing.assert_close(model.forward_intermediates(x)[0], final, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match='norm=True.*per stage.*features_only=True'):
        model.forward_intermediates(x, norm=True)


@pytest.mark.parametrize('name', SMALLEST)
def test_features_only_channels_and_reductions(name):
    """features_only (timm's FeatureGetterNet over forward_intermediates): one map per feature_info entry with
    its channels and reduction, at odd sizes; out_indices picks stages and prunes the later ones."""
    model = timm.create_model(name, features_only=True).eval()
    channels, reductions = model.feature_info.channels(), model.feature_info.reduction()
    assert len(channels) == 4 and reductions == [4, 8, 16, 32]
    x = torch.randn(1, 3, 65, 47)
    with torch.no_grad():
        outs = model(x)
        assert [tuple(o.shape) for o in outs] == [(1, c, math.ceil(65 / r), math.ceil(47 / r))
                                                  for c, r in zip(channels, reductions)]
        assert not any(o.isnan().any() for o in outs)
        some = timm.create_model(name, features_only=True, out_indices=(0, 2)).eval()
        some.load_state_dict({k: v for k, v in model.state_dict().items() if k in some.state_dict()})
        picked = some(x)
    assert some.feature_info.channels() == [channels[0], channels[2]]
    backbone = some.model.backbone
    assert len(getattr(backbone, backbone.stages_name)) == 3  # stage 3 pruned
    for got, want in zip(picked, (outs[0], outs[2])):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_features_only_takes_only_the_getter():
    with pytest.raises(ValueError, match="feature_cls='list'.*feature_cls='getter'"):
        timm.create_model('ppma_tiny', features_only=True, feature_cls='list')


@pytest.mark.heavy
@pytest.mark.parametrize('name', [n for n in NAMES if n not in SMALLEST])
def test_every_size_forward_backward_and_features(name):
    """The checks above on the other sizes: forward, backward to every parameter, forward_intermediates against
    forward_features, features_only channels and reductions."""
    model = timm.create_model(name, num_classes=7).train()
    out = model(torch.randn(2, 3, 32, 48))
    out.mean().backward()
    assert out.shape == (2, 7) and [n for n, p in model.named_parameters() if p.grad is None] == []
    x = torch.randn(1, 3, 65, 47)
    with torch.no_grad():
        final, inter = model.eval().forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x), rtol=0, atol=0)
        features = timm.create_model(name, features_only=True).eval()
        shapes = [tuple(o.shape) for o in features(x)]
    assert shapes == [(1, c, math.ceil(65 / r), math.ceil(47 / r))
                      for c, r in zip(features.feature_info.channels(), features.feature_info.reduction())]
    assert features.feature_info.channels() == [t.shape[1] for t in inter]
