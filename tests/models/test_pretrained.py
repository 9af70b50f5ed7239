"""mmseg's ``pretrained`` argument on every backbone, and upstream mmseg configs (DeepLabV3+, SegFormer) with the
backbone swapped for PPMA and only the channel lists changed: built, losses computed and back-propagated on CPU."""
import warnings

import pytest
import torch
from mmengine.config import Config

from mmppma.models import MLLA, PPMA, RMT, VMINet

from .conftest import SMALL_ARCH

DIMS = SMALL_ARCH['embed_dims']
BACKBONES = {
    'PPMA': lambda **kw: PPMA(SMALL_ARCH, **kw),
    'RMT': lambda **kw: RMT(SMALL_ARCH, **kw),
    'MLLA': lambda **kw: MLLA(dict(embed_dims=[16, 32, 32, 64], depths=[1, 1, 1, 1], num_heads=[2, 2, 4, 4],
                                   mlp_ratio=2.0), **kw),
    'VMINet': lambda **kw: VMINet(dict(embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], mlp_ratios=[2, 2, 2, 2],
                                       stem_channels=8), img_size=64, **kw),
}
ZOO_URIS = ['open-mmlab://resnet50_v1c', 'torchvision://resnet50', 'mmcls://mobilenet_v2']
DEPRECATED = 'pretrained is deprecated, please use "init_cfg" instead'


@pytest.mark.parametrize('name', BACKBONES)
def test_pretrained_none_keeps_init_cfg(name):
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no deprecation warning without pretrained
        assert BACKBONES[name](pretrained=None).init_cfg is None
        init_cfg = dict(type='Pretrained', checkpoint='x.pth', prefix='backbone.')
        assert BACKBONES[name](init_cfg=init_cfg, pretrained=None).init_cfg == init_cfg


@pytest.mark.parametrize('name', BACKBONES)
def test_pretrained_path_loads_through_init_cfg(name, tmp_path):
    source = BACKBONES[name]()
    path = tmp_path / 'backbone.pth'
    torch.save(source.state_dict(), path)
    with pytest.warns(UserWarning, match=DEPRECATED):
        model = BACKBONES[name](pretrained=str(path))
    assert model.init_cfg == dict(type='Pretrained', checkpoint=str(path))
    want = source.state_dict()
    float_keys = [k for k, v in want.items() if v.is_floating_point() and v.numel() > 1]
    assert any(not torch.equal(model.state_dict()[k], want[k]) for k in float_keys)  # freshly initialized
    model.init_weights()
    got = model.state_dict()
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize('uri', ZOO_URIS)
@pytest.mark.parametrize('name', BACKBONES)
def test_model_zoo_uri_of_another_architecture_is_an_error(name, uri):
    with pytest.raises(ValueError) as info:
        BACKBONES[name](pretrained=uri)
    message = str(info.value)
    assert uri in message and 'model.pretrained=None' in message
    assert "init_cfg=dict(type='Pretrained'" in message and '--backbone-only' in message


@pytest.mark.parametrize('name', BACKBONES)
def test_pretrained_bad_values(name):
    with pytest.raises(ValueError, match='both set'):
        BACKBONES[name](pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='b.pth'))
    with pytest.raises(TypeError, match='pretrained must be'):
        BACKBONES[name](pretrained=3)


# ------------------------------------------------------------------ upstream mmseg configs, backbone swapped
def swapped(base: str, heads: str) -> Config:
    """``base`` (an mmseg:: config) with the backbone replaced by a small PPMA; ``heads`` sets channel lists."""
    return Config.fromstring(f"""
_base_ = '{base}'
model = dict(
    backbone=dict(_delete_=True, type='mmppma.PPMA', arch={SMALL_ARCH!r}, out_indices=(0, 1, 2, 3)),
{heads})
""", file_format='.py')


def seg_losses(model, size: int = 64, classes: int = 150) -> dict:
    """Losses on a synthetic batch of two size x size images (the data preprocessor's crop padding skipped)."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    samples = []
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(size, size), pad_shape=(size, size),
                                             ori_shape=(size, size)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, classes, (1, size, size)))
        samples.append(sample)
    return model(torch.randn(2, 3, size, size), samples, mode='loss')


def build_seg(cfg: Config):
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    return MODELS.build(cfg.model)


def check_trains(model) -> None:
    model.init_weights()
    model.train()
    losses = seg_losses(model)
    total = sum(v for k, v in losses.items() if k.startswith('loss') or '.loss' in k)
    assert torch.isfinite(total)
    total.backward()
    assert model.backbone.layers[0].blocks[0].retention.q_proj.weight.grad is not None
    assert model.backbone.layers[3].blocks[0].retention.path_embed.A_log.grad is not None


@pytest.mark.slow
def test_mmseg_deeplabv3plus_config_with_ppma(mmseg_ready):
    def config() -> Config:
        return swapped('mmseg::deeplabv3plus/deeplabv3plus_r50-d8_4xb4-80k_ade20k-512x512.py',
                       f'    decode_head=dict(in_channels={DIMS[3]}, c1_in_channels={DIMS[0]}),\n'
                       f'    auxiliary_head=dict(in_channels={DIMS[2]}),')

    cfg = config()
    assert cfg.model.pretrained == 'open-mmlab://resnet50_v1c'  # what the upstream config asks for
    with pytest.raises(ValueError, match='model.pretrained=None'):
        build_seg(cfg)
    cfg = config()  # EncoderDecoder wrote pretrained into the backbone's config while building
    cfg.model.pretrained = None  # as the message says
    check_trains(build_seg(cfg))


@pytest.mark.slow
def test_mmseg_segformer_config_with_ppma(mmseg_ready):
    cfg = swapped('mmseg::segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py',
                  f'    decode_head=dict(in_channels={DIMS!r}),')
    check_trains(build_seg(cfg))
