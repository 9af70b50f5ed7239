"""A backbone family is its backbone and its spec (mmppma/models/backbones/family.py, docs/code_layout.md): a toy
family written here, a two-stage backbone and its spec with a release format of its own, reaches an mmpretrain
config, the release converter (both ways, and on load) and timm, with no other file changed; and the shipped
families' specs are complete."""
import types
from typing import Dict, List, Optional, Tuple

import pytest
import timm
import torch
import torch.nn as nn
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

import mmppma.timm_models as tm
from mmppma.models.backbones import release
from mmppma.models.backbones.base import StagedBackbone, resolve_arch_settings
from mmppma.models.backbones.family import FAMILIES, FamilySpec, Variant, family_of, register_family, variant_of
from mmppma.models.backbones.stages import SHIPPED, attention_stages
from mmppma.models.conversion import mmppma_to_release, release_to_mmppma
from mmppma.registry import register_model
from mmppma.utils import model_zoo

from .conftest import REPO_ROOT, random_tensors

# the toy family registers again in the second test that takes it: timm says it overwrites the first's names
pytestmark = pytest.mark.filterwarnings('ignore:Overwriting toy_tiny:UserWarning')
TOY_ARCH_ZOO = dict.fromkeys(['t', 'tiny'], dict(embed_dims=[8, 16], depths=[1, 2]))


# ---------------------------------------------------------------- the toy family: its backbone file ...
@register_model
class ToyNet(StagedBackbone):
    """A conv stem (stride 4) and stages of 3 x 3 convs (a stride-2 one first from the second stage on), NCHW;
    per output a BatchNorm ``norm{i}`` when ``out_norm``."""
    arch_zoo = TOY_ARCH_ZOO
    stem_name, stages_name, channels_last_stages = 'stem', 'stages', False

    def __init__(self, arch='t', in_channels: int = 3, *, out_norm: bool = True, **kwargs) -> None:
        super().__init__(resolve_arch_settings(arch, TOY_ARCH_ZOO, 'Toy', ('embed_dims', 'depths')), in_channels,
                         **kwargs)
        dims = self.embed_dims
        self.stem = nn.Conv2d(in_channels, dims[0], 4, stride=4)
        self.stages = nn.ModuleList(
            nn.Sequential(nn.Conv2d(dims[max(i - 1, 0)], dims[i], 3, stride=2 if i else 1, padding=1),
                          *(nn.Conv2d(dims[i], dims[i], 3, padding=1) for _ in range(depth)))
            for i, depth in enumerate(self.depths))
        if out_norm:
            self._add_out_norms(lambda i: nn.BatchNorm2d(dims[i]))
        self._freeze_stages()

    def out_norm_name(self, i: int) -> str:
        return f'norm{i}'

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.forward_stages(x, self.out_indices))


# ---------------------------------------------------------------- ... and its spec file
def _measure(backbone: Dict[str, torch.Tensor]) -> dict:
    stages = release.stage_count(backbone, 'stages')
    out_norms = release.out_norm_indices(backbone)
    return dict(embed_dims=[backbone[f'stages.{s}.0.weight'].shape[0] for s in range(stages)],
                depths=[release.block_indices(backbone, rf'stages\.{s}\.(\d+)\.')[-1] for s in range(stages)],
                out_norms=out_norms, out_norm=bool(out_norms))


def _to_release(state: Dict[str, torch.Tensor], downstream: bool = False) -> Dict[str, torch.Tensor]:
    if downstream:
        return dict(state)
    backbone = {k[len('backbone.'):]: v for k, v in state.items() if k.startswith('backbone.')}
    others = {k: v for k, v in state.items() if not k.startswith('backbone.')}
    return release.linear_head_to_release(backbone, others, release.stage_count(backbone, 'stages'))


#: the toy release: the backbone's keys at the root, its final norm ``norm``, its classifier ``head``
TOY_RELEASE = types.SimpleNamespace(
    FAMILY='Toy', ROOTS=('stem.', 'stages.'), ARCH_NAMES=('t', ), IMPLIED={}, HEAD_IN_BACKBONE=True, measure=_measure,
    map_backbone=lambda backbone, measured, downstream, info: backbone, map_head=release.linear_head,
    release_only=lambda state: False, to_release=_to_release)
TOY = FamilySpec(release=TOY_RELEASE, variants=(Variant('Toy', ToyNet), ), sizes=dict(tiny='t'), head='linear',
                 stem='stem', classifier_options=dict(out_norm=True), dense_options=dict(out_norm=True))


@pytest.fixture
def toy():
    """The toy family registered (as its spec file does on import), for one test."""
    register_family(TOY)
    yield TOY
    del FAMILIES[TOY.name]  # the rest of the session sees the shipped families only
    for name in [n for n, (family, _) in tm.MODEL_NAMES.items() if family == 'toy']:
        del tm.MODEL_NAMES[name]
    del tm.TIMM_FAMILIES['toy']


def classifier(num_classes: int) -> nn.Module:
    """An mmpretrain ImageClassifier of a config's model dict around the toy backbone."""
    cfg = dict(type='ImageClassifier', backbone=dict(type='mmppma.ToyNet', arch='tiny', out_indices=(-1, )),
               neck=dict(type='GlobalAveragePooling'),
               head=dict(type='LinearClsHead', num_classes=num_classes, in_channels=16))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(cfg).eval()


def test_a_new_family_reaches_configs_conversion_and_timm(toy, tmp_path):
    assert family_of('TOY') is family_of(ToyNet) is toy and variant_of('toy').backbone is ToyNet
    model = classifier(num_classes=1000)  # timm keeps the classifier of a checkpoint of its cfg's class count
    ours = {k: v.shape for k, v in model.state_dict().items()}
    # a release classifier's state dict: the backbone at the root, its final norm and head under their own names
    state = random_tensors({k: v.shape for k, v in _to_release(model.state_dict()).items()}, scale=0.2)
    assert 'norm.weight' in state and 'head.weight' in state and not any(k.startswith('backbone.') for k in state)

    # the converter: arch detected, keys and shapes checked against the reference model, and back
    converted, info = release_to_mmppma(state, 'toy')
    assert (info['family'], info['arch'], info['config'], info['num_classes']) == \
        ('Toy', 't', 'configs/toy_t_8xb128_in1k.py', 1000)
    assert {k: v.shape for k, v in converted.items()} == ours
    back = mmppma_to_release(converted, 'Toy')
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in state.items()}
    model.load_state_dict(converted, strict=True)
    # a whole-model load of the release file converts it on load (the hook on the backbone's parent)
    loaded = classifier(num_classes=1000)
    loaded.load_state_dict(state)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in converted.items())

    # timm: every size of the family registered, the release file read through the family's format
    assert timm.list_models('toy_*') == ['toy_tiny']
    path = tmp_path / 'toy_release.pth'
    torch.save({'model': state}, path)
    net = timm.create_model('toy_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    assert net.pretrained_cfg['first_conv'] == 'backbone.stem'
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        torch.testing.assert_close(net.eval()(x), model(x, mode='tensor'))
    assert [f.shape[1:] for f in net.forward_intermediates(x, intermediates_only=True)] == [(8, 16, 12), (16, 8, 6)]


def test_family_names_are_unique(toy):
    with pytest.raises(ValueError, match=r"the names \['toy'\] are taken"):
        register_family(TOY)
    with pytest.raises(ValueError, match=r"the names \['rmt'\] are taken"):
        register_family(FamilySpec(release=types.SimpleNamespace(FAMILY='Other', ARCH_NAMES=('t', )),
                                   variants=(Variant('Other', ToyNet), Variant('RMT', ToyNet)), sizes=dict(tiny='t'),
                                   head='linear', stem='stem'))
    with pytest.raises(ValueError, match="family=.ResNet.; choose one of .*Toy"):
        family_of('ResNet')


# ---------------------------------------------------------------- the shipped families
@pytest.mark.parametrize('name', list(FAMILIES))
def test_a_shipped_spec_is_complete(name):
    """Every size's config arch name is in the arch table, every metafile exists and is in the model index, every
    default config of a converted classifier exists, and the kernel tools' models have kernels."""
    spec = FAMILIES[name]
    index = (REPO_ROOT / 'mmppma/.mim/model-index.yml').read_text()
    for variant in spec.variants:
        assert family_of(variant.backbone) is spec and variant.family is spec
        if variant.metafile:
            assert f'metafiles/{variant.metafile}/metafile.yml' in index
            assert (REPO_ROOT / 'mmppma/.mim/metafiles' / variant.metafile / 'metafile.yml').is_file()
        for size, arch in spec.sizes.items():
            assert f'{variant.key}_{size}' in tm.MODEL_NAMES
            if variant.metafile:  # an indexed variant has the repository config of every size
                info: Dict[str, Optional[str]] = dict(family=variant.name, revision=None, mask='polyline')
                assert (REPO_ROOT / spec.default_config(arch, info)).is_file()
    labels: List[str] = [label for label, (v, _) in SHIPPED.items() if family_of(v) is spec]
    assert sorted(labels) == sorted(spec.kernel_models)
    for label in labels:
        kinds, heads, dims = attention_stages(label)
        assert len(kinds) == len(heads) == len(dims) and variant_of(SHIPPED[label][0]).kernels


def test_the_model_index_lists_the_registered_metafiles():
    index = (REPO_ROOT / 'mmppma/.mim/model-index.yml').read_text()
    listed = [line.strip()[2:] for line in index.splitlines() if line.strip().startswith('- metafiles/')]
    assert sorted(listed) == sorted(str(p.relative_to(REPO_ROOT / 'mmppma/.mim')) for p in model_zoo.metafiles())
