"""LayerDecayOptimWrapperConstructor on mmpretrain/mmdet/mmseg-shaped models (a module with .backbone)."""
import pytest
import torch.nn as nn

from mmppma.engine import LayerDecayOptimWrapperConstructor
from mmppma.models import PPMA, PPMAClsHead

from ..models.conftest import SMALL_ARCH


class Detector(nn.Module):
    """Stands in for an upstream model: a backbone plus other modules."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.backbone = PPMA(SMALL_ARCH, **kwargs)
        self.neck = nn.Conv2d(64, 8, 1)
        self.head = PPMAClsHead(5, in_channels=64, loss=nn.Identity())


def build(model, rate=1.0, **cfg):
    constructor = LayerDecayOptimWrapperConstructor(
        dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)), dict(layer_decay_rate=rate, **cfg))
    return constructor(model).optimizer


def lookup(optimizer):
    return {id(p): g for g in optimizer.param_groups for p in g['params']}


def test_weight_decay_exclusions_and_layer_wise_lr_decay():
    """No decay on norms, biases, A_log, dt_bias; each parameter in one group; lr * rate^(layers above)."""
    model, rate = Detector(), 0.5
    groups = lookup(build(model, rate))
    for name, p in model.named_parameters():
        wd = groups[id(p)]['weight_decay']
        excluded = p.ndim <= 1 or name.endswith('.bias') or 'A_log' in name or 'dt_bias' in name
        assert wd == (0.0 if excluded else 0.05), name
    assert {'A_log', 'dt_bias'} <= {name.rsplit('.', 1)[-1] for name, _ in model.named_parameters()}
    assert sum(len(g['params']) for g in build(model).param_groups) == len(list(model.parameters()))
    n = sum(SMALL_ARCH['depths']) + 2
    lr = {name: groups[id(p)]['lr'] for name, p in model.named_parameters()}
    assert lr['backbone.patch_embed.proj.0.weight'] == pytest.approx(1e-3 * rate**(n - 1))
    assert lr['backbone.layers.0.blocks.0.ffn.fc1.weight'] == pytest.approx(1e-3 * rate**(n - 2))
    assert lr['backbone.layers.3.blocks.0.ffn.fc1.weight'] == pytest.approx(1e-3 * rate**1)
    assert lr['head.fc.weight'] == lr['neck.weight'] == pytest.approx(1e-3)


def test_frozen_parameters_are_left_out_and_custom_keys_apply():
    model = Detector(frozen_stages=1)
    opt = build(model, custom_keys={'neck': dict(lr_mult=0.1, decay_mult=0.0)})
    ids = lookup(opt)
    assert all(id(p) not in ids for p in model.backbone.patch_embed.parameters())
    assert ids[id(model.neck.weight)]['lr'] == pytest.approx(1e-4) and ids[id(model.neck.weight)]['weight_decay'] == 0


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match='unknown paramwise_cfg keys'):
        build(Detector(), norm_decay_mult=0.0)
    with pytest.raises(ValueError, match='get_layer_depth'):
        build(nn.Sequential(nn.Linear(2, 2)), rate=0.9)
    with pytest.raises(ValueError, match='layer_decay_rate'):
        build(Detector(), rate=1.5)
    build(nn.Sequential(nn.Linear(2, 2)))  # no layer decay: any model


def test_bare_backbone_and_empty_paramwise_cfg():
    backbone = PPMA(SMALL_ARCH)
    groups = lookup(build(backbone, rate=0.9))
    assert groups[id(backbone.patch_embed.proj[0].weight)]['lr'] < groups[id(backbone.outnorm3.weight)]['lr']
    wrapper = LayerDecayOptimWrapperConstructor(dict(optimizer=dict(type='SGD', lr=0.1, weight_decay=1e-4)))(backbone)
    assert all(g['weight_decay'] == 0 for g in wrapper.optimizer.param_groups if g['params'][0].ndim <= 1)
