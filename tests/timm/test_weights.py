"""The timm models' weights and data config against the other routes: a release file (random tensors in the
release's keys, served on 127.0.0.1 or local) gives the logits of the explicit converter route; an mmdet / mmseg
backbone's weights give, through features_only, that backbone's maps; timm's eval transform is the configs' test
pipeline."""
import re
from pathlib import Path

import pytest
import timm
import torch
import torch.nn as nn
from mmengine.config import Config

import mmppma.timm_models as tm
from mmppma.models import PPMA, PPMAClsHead
from mmppma.models.conversion import CheckpointMismatchError, release_to_mmppma
from mmppma.registry import MODELS

from ..test_model_zoo import release_state, save_release, served  # noqa: F401  (served: a pytest fixture)

REPO = Path(__file__).resolve().parents[2]
IMAGES = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(1))


def ppma_t_converter_route(state: dict) -> nn.Module:
    """The release classifier with the converter's state dict: PPMA-T (classification outputs) and PPMAClsHead."""
    converted, _ = release_to_mmppma(state, 'PPMA')
    model = nn.ModuleDict(dict(backbone=PPMA('tiny', out_indices=(3, ), out_norm=False),
                               head=PPMAClsHead(1000, 512, 1024, loss=nn.Identity())))
    model.load_state_dict(converted)
    return model.eval()


@torch.no_grad()
def test_pretrained_url_downloads_and_converts(served, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    model = timm.create_model('ppma_tiny.in1k', pretrained=True, pretrained_cfg_overlay=dict(url=served['url'])).eval()
    reference = ppma_t_converter_route(release_state('PPMA'))
    torch.testing.assert_close(model(IMAGES), reference.head(reference.backbone(IMAGES)), rtol=0, atol=0)
    assert 'state_dict' not in model.pretrained_cfg and model.pretrained_cfg['url'] == served['url']
    assert (tmp_path / 'torch_home' / 'hub' / 'checkpoints' / 'best.pth').read_bytes() == served['file'].read_bytes()


def test_pretrained_true_reads_the_index_url(monkeypatch):
    read = []
    monkeypatch.setattr(tm, 'read_checkpoint_state', lambda source: read.append(source) or release_state('PPMA'))
    timm.create_model('ppma_tiny', pretrained=True)
    assert read == [tm.release_url('ppma_tiny')] and read[0].startswith('https://huggingface.co/ZhongchenZhao/PPMA/')


@torch.no_grad()
def test_local_release_and_mmppma_files_give_the_converter_routes_logits(tmp_path):
    """A VMINet-Ti release file (revision 6b11d4a's keys) and the mmppma checkpoint the converter writes: the
    logits of mmpretrain's init_model on the converted file; the model's default options (7c2632c, as the index's
    files) give an error naming the options to pass."""
    from mmpretrain.apis import init_model
    state = release_state('VMINet')
    release = save_release(tmp_path / 'release.pth', state)
    with pytest.raises(ValueError, match=r"revision 6b11d4a.*context_mask='none', proj_norm=True.*timm.create_model"):
        timm.create_model('vminet_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=release))
    converted, _ = release_to_mmppma(state, 'VMINet')
    torch.save({'state_dict': converted, 'meta': {}}, tmp_path / 'converted.pth')
    config = str(REPO / 'configs/vminet_ti_release-6b11d4a_in1k.py')
    want = init_model(config, str(tmp_path / 'converted.pth'))(IMAGES, mode='tensor')
    for path in (release, str(tmp_path / 'converted.pth')):
        model = timm.create_model('vminet_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=path),
                                  context_mask='none', proj_norm=True).eval()
        torch.testing.assert_close(model(IMAGES), want, rtol=0, atol=0, msg=path)


def test_features_only_takes_the_release_backbone_and_names_what_it_lacks(tmp_path, monkeypatch):
    from mmppma.models.backbones import release as release_module
    reports = []
    monkeypatch.setattr(release_module, '_log', reports.append)  # the one line mmengine's logger receives
    state = release_state('PPMA')
    release = save_release(tmp_path / 'best.pth', state)
    model = timm.create_model('ppma_tiny', features_only=True, pretrained=True,
                              pretrained_cfg_overlay=dict(file=release))
    got = model.model.backbone.state_dict()
    for key, value in state.items():
        if key.startswith(('patch_embed.', 'layers.')):
            assert torch.equal(got[key], value), key
    norms = [f'backbone.outnorm{i}.{p}' for i in range(4) for p in ('weight', 'bias')]
    assert len(reports) == 1 and 'keep their initialization' in reports[0]
    assert all(repr(k) in reports[0] for k in norms)


def test_checkpoint_path_and_another_class_count(tmp_path):
    """timm's checkpoint_path (its own loader; the release is converted on load by the hook on the backbone's
    parent) and pretrained weights into a 10-class model (timm drops the 1000-class fc, the rest loads)."""
    state = release_state('PPMA')
    release = save_release(tmp_path / 'best.pth', state)
    model = timm.create_model('ppma_tiny', checkpoint_path=release)
    assert torch.equal(model.head.fc.weight, state['head.weight'])
    assert torch.equal(model.backbone.patch_embed.proj[0].weight, state['patch_embed.proj.0.weight'])
    ten = timm.create_model('ppma_tiny', pretrained=True, num_classes=10, pretrained_cfg_overlay=dict(file=release))
    assert ten.head.fc.weight.shape == (10, 1024) and torch.equal(ten.head.proj.weight, state['proj.weight'])


@pytest.mark.parametrize('name, where', [('rmt_tiny', 'Baidu'), ('ppmla_tiny', 'no PPMLA weights'),
                                         ('vminet_base', 'no VMINet-B weights')])
def test_no_direct_download_says_where_and_how(name, where):
    with pytest.raises(RuntimeError, match=f"{where}.*pretrained_cfg_overlay=dict\\(file="):
        timm.create_model(name, pretrained=True)


def test_another_familys_checkpoint_is_refused(tmp_path):
    release = save_release(tmp_path / 'best.pth', release_state('PPMA'))
    with pytest.raises(CheckpointMismatchError, match='not an MLLA backbone.*its own family and size'):
        timm.create_model('mlla_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=release))


@torch.no_grad()
def test_readme_lines_as_written(monkeypatch):
    """The README's timm block, run as it is (the download replaced by the release-layout state it would read):
    the converter route's logits on an image through its transform."""
    from PIL import Image
    block = next(b for b in re.findall(r'```python\n(.*?)```', (REPO / 'README.md').read_text(), re.S)
                 if 'timm.create_model' in b)
    state, sources = release_state('PPMA'), []
    monkeypatch.setattr(tm, 'read_checkpoint_state', lambda source: sources.append(source) or state)
    scope = {}
    exec(block, scope)
    assert sources == [tm.release_url('ppma_tiny')]
    image = Image.fromarray(torch.randint(0, 256, (240, 300, 3), dtype=torch.uint8).numpy())
    x = scope['transform'](image)[None]
    assert x.shape == (1, 3, 224, 224)
    reference = ppma_t_converter_route(state)
    torch.testing.assert_close(scope['model'](x), reference.head(reference.backbone(x)), rtol=0, atol=0)


# ---------------------------------------------------------------- dense prediction
DENSE = [('ppma_tiny', 'mask_rcnn_ppma_t_1x_coco.py'), ('vminet_tiny', 'upernet_vminet_ti_512x512_160k_ade20k.py'),
         pytest.param('mlla_tiny', 'mask_rcnn_mlla_t_1x_coco.py', marks=pytest.mark.heavy),
         pytest.param('rmt_tiny', 'upernet_rmt_t_512x512_160k_ade20k.py', marks=pytest.mark.heavy),
         pytest.param('ppmla_tiny', 'upernet_ppmla_t_512x512_160k_ade20k.py', marks=pytest.mark.heavy)]


@torch.no_grad()
@pytest.mark.parametrize('name, config', DENSE)
def test_features_only_gives_the_dense_backbones_maps(name, config, tmp_path):
    """The backbone of an mmdet / mmseg config, its weights saved as a whole-model checkpoint (with a neck):
    features_only=True with that file gives the same maps at odd sizes."""
    cfg = Config.fromfile(str(REPO / 'configs' / config)).model.backbone
    cfg.pop('init_cfg', None)
    backbone = MODELS.build(cfg).eval()
    state = {f'backbone.{k}': v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
             for k, v in backbone.state_dict().items()}
    backbone.load_state_dict({k[len('backbone.'):]: v for k, v in state.items()})
    torch.save({'state_dict': {**state, 'neck.lateral_convs.0.conv.weight': torch.zeros(1)}}, tmp_path / 'dense.pth')
    options = {k: getattr(backbone, k) for k in ('context_mask', 'proj_norm') if hasattr(backbone, k)}
    model = timm.create_model(name, features_only=True, pretrained=True, **options,
                              pretrained_cfg_overlay=dict(file=str(tmp_path / 'dense.pth'))).eval()
    for size in ((65, 47), (33, 97)):
        x = torch.randn(1, 3, *size)
        want, got = backbone(x), model(x)
        assert len(got) == len(want) == 4
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


# ---------------------------------------------------------------- data config
def test_timm_eval_transform_is_the_configs_test_pipeline(tmp_path):
    """resolve_data_config + create_transform on a registered model: the pixels of the configs' test pipeline
    (mmpretrain's ResizeEdge 256 bicubic, CenterCrop 224) normalized by their data preprocessor."""
    from mmcv.transforms import Compose
    from mmengine.registry import DefaultScope
    from PIL import Image
    pytest.importorskip('mmpretrain.datasets')
    image = torch.randint(0, 256, (240, 300, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    Image.fromarray(image.numpy()).save(tmp_path / 'image.png')
    for name, config in (('ppma_tiny', 'ppma_t_8xb128_in1k.py'), ('mlla_tiny', 'mlla_t_8xb128_in1k.py'),
                         ('vminet_tiny', 'vminet_ti_8xb128_in1k.py')):
        cfg = Config.fromfile(str(REPO / 'configs' / config))
        with DefaultScope.overwrite_default_scope('mmpretrain'):
            packed = Compose(cfg.test_dataloader.dataset.pipeline)(dict(img_path=str(tmp_path / 'image.png')))
        mean = torch.tensor(cfg.data_preprocessor.mean).view(3, 1, 1)
        std = torch.tensor(cfg.data_preprocessor.std).view(3, 1, 1)
        want = (packed['inputs'].flip(0).float() - mean) / std  # BGR -> RGB, as the preprocessor's to_rgb
        with torch.device('meta'):  # the cfg only
            data_config = timm.data.resolve_data_config({}, model=timm.create_model(name))
        got = timm.data.create_transform(**data_config)(Image.open(tmp_path / 'image.png').convert('RGB'))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=name)
