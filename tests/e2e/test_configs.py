"""Every config under configs/ loads and builds its model; the detection / segmentation configs carry the
release's recipe (docs/method.md §9) and per-arch settings consistent with the backbone's arch table."""
import argparse
from pathlib import Path

import pytest
from mmengine.config import Config
from mmengine.registry import DefaultScope

from mmppma.models.backbones import ARCH_ZOO

from .conftest import CONFIGS, TINY_DET

ALL_CONFIGS = sorted(p for p in CONFIGS.rglob('*.py') if '_base_' not in p.parts)
# the PPMA/RMT recipe checks; other families (MLLA, VMINet) carry their own config tests
DET = sorted(p for f in ('ppma', 'rmt') for p in CONFIGS.glob(f'mask_rcnn_{f}_*_coco.py'))
SEG = sorted(p for f in ('ppma', 'rmt') for p in CONFIGS.glob(f'upernet_{f}_*_ade20k.py'))
DROP_PATH = {'tiny': 0.1, 'small': 0.15, 'base': 0.4}
ARCH = {'t': 'tiny', 's': 'small', 'b': 'base'}


def scope_ready(scope: str) -> None:
    from mmppma.utils import register_scope_modules
    try:
        register_scope_modules(scope)
    except ImportError as e:
        pytest.skip(f'default_scope {scope!r} is not usable here: {e}')


@pytest.mark.parametrize('path', ALL_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_config_loads_and_builds(path):
    cfg = Config.fromfile(str(path))
    scope = cfg.default_scope
    try:
        scope_ready(scope)
    except pytest.skip.Exception:
        if scope != 'mmpretrain':
            raise
        # mmpretrain's datasets need torchvision, its models do not: build the model all the same
        import mmpretrain.models  # noqa: F401

        import mmppma  # noqa: F401
    from mmengine.registry import MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(cfg.model)
    backbone = model.backbone
    assert type(backbone).__name__ == cfg.model.backbone.type.split('.')[-1]
    assert sum(p.numel() for p in backbone.parameters()) > 1e6


@pytest.mark.parametrize('path', DET + SEG, ids=lambda p: p.name)
def test_per_arch_settings(path):
    """type/arch/drop path from the file name; head input channels = the arch's stage channels; pretrained
    weights from the conventional path via a top-level variable."""
    cfg = Config.fromfile(str(path))
    family, size = _name_parts(path)
    arch = ARCH[size]
    dims = ARCH_ZOO[arch]['embed_dims']
    backbone = cfg.model.backbone
    assert backbone.type == f'mmppma.{family.upper()}' and backbone.arch == arch
    assert backbone.drop_path_rate == DROP_PATH[arch] and tuple(backbone.out_indices) == (0, 1, 2, 3)
    assert cfg.pretrained == f'checkpoints/{family}_{size}_in1k.pth'
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=cfg.pretrained, prefix='backbone.')
    if path in DET:
        assert cfg.model.neck.in_channels == dims
    else:
        assert cfg.model.decode_head.in_channels == dims and cfg.model.auxiliary_head.in_channels == dims[2]
        assert cfg.model.pretrained is None


DENSE = sorted(p for pattern in ('mask_rcnn_*_coco.py', 'upernet_*_ade20k.py') for p in CONFIGS.glob(pattern))


@pytest.mark.parametrize('path', DENSE, ids=lambda p: p.name)
def test_pretrained_weights_and_training_from_scratch(path):
    """Every detection / segmentation config loads the top-level ``pretrained`` checkpoint into its backbone
    (the family base holds the Pretrained type and prefix, the per-arch file the path); the documented
    ``--cfg-options model.backbone.init_cfg=None`` trains from scratch."""
    from mmengine.config import DictAction
    cfg = Config.fromfile(str(path))
    parts = path.stem.split('_')
    family, size = parts[2:4] if path.name.startswith('mask_rcnn_') else parts[1:3]
    assert cfg.pretrained == f'checkpoints/{family}_{size}_in1k.pth'
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint=cfg.pretrained, prefix='backbone.')
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg.merge_from_dict(parser.parse_args(['--cfg-options', 'model.backbone.init_cfg=None']).cfg_options)
    assert cfg.model.backbone.init_cfg is None


def _name_parts(path: Path):
    parts = path.stem.split('_')
    i = parts.index('ppma') if 'ppma' in parts else parts.index('rmt')
    return parts[i], parts[i + 1]


def _optimizer_recipe(cfg, lr):
    opt = cfg.optim_wrapper
    assert opt.type == 'AmpOptimWrapper'
    assert (opt.optimizer.type, opt.optimizer.lr, opt.optimizer.weight_decay) == ('AdamW', lr, 0.05)
    assert opt.paramwise_cfg.norm_decay_mult == 0.0
    assert {k: v.decay_mult for k, v in opt.paramwise_cfg.custom_keys.items()} == {'.A_log': 0.0, '.dt_bias': 0.0}
    assert cfg.auto_scale_lr.base_batch_size == 16


@pytest.mark.parametrize('path', DET, ids=lambda p: p.name)
def test_detection_recipe(path):
    cfg = Config.fromfile(str(path))
    assert cfg.default_scope == 'mmdet' and cfg.model.type == 'MaskRCNN'
    _optimizer_recipe(cfg, 1e-4)
    assert cfg.train_dataloader.batch_size == 2  # x 8 GPUs = 16
    warmup, steps = cfg.param_scheduler
    assert (warmup.type, warmup.end, warmup.by_epoch) == ('LinearLR', 500, False)
    assert set(cfg.val_evaluator.metric) == {'bbox', 'segm'}
    if '_1x_' in path.name:
        assert cfg.train_cfg.max_epochs == 12 and steps.milestones == [8, 11]
        resize = [t for t in cfg.train_pipeline if t.type == 'Resize']
        assert resize[0].scale == (1333, 800)
    else:
        assert cfg.train_cfg.max_epochs == 36 and steps.milestones == [27, 33]
        choice = [t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'RandomChoice'][0]
        shorts = sorted(s[0] for s in choice.transforms[0][0].scales)
        assert shorts[0] == 480 and shorts[-1] == 800 and len(shorts) == 11
        assert all(s[1] == 1333 for s in choice.transforms[0][0].scales)


@pytest.mark.parametrize('path', SEG, ids=lambda p: p.name)
def test_segmentation_recipe(path):
    cfg = Config.fromfile(str(path))
    assert cfg.default_scope == 'mmseg' and cfg.model.type == 'EncoderDecoder'
    _optimizer_recipe(cfg, 6e-5)
    assert cfg.train_dataloader.batch_size == 2 and cfg.crop_size == (512, 512)
    assert cfg.train_cfg.max_iters == 160000
    warmup, poly = cfg.param_scheduler
    assert (warmup.type, warmup.start_factor, warmup.end) == ('LinearLR', 1e-6, 1500)
    assert (poly.type, poly.power, poly.eta_min, poly.begin, poly.end) == ('PolyLR', 1.0, 0.0, 1500, 160000)
    assert cfg.model.decode_head.num_classes == 150 and cfg.val_evaluator.type == 'IoUMetric'


def test_weight_decay_exclusions_in_the_built_optimizer(tiny_env):
    """The detection recipe's paramwise_cfg on the real model: no decay on norms and A_log/dt_bias, decay
    on Linear/conv weights."""
    scope_ready('mmdet')
    from mmdet.registry import MODELS
    from mmengine.optim import build_optim_wrapper
    cfg = Config.fromfile(str(TINY_DET))
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    decay = {id(p): g['weight_decay'] for g in wrapper.optimizer.param_groups for p in g['params']}
    named = dict(model.named_parameters())
    assert len(decay) == len(named)
    blk = 'backbone.layers.2.blocks.0.'
    for name in ('retention.path_embed.A_log', 'retention.path_embed.dt_bias', 'retention_layer_norm.weight',
                 'final_layer_norm.bias'):
        assert decay[id(named[blk + name])] == 0.0, name
    assert decay[id(named['backbone.outnorm2.weight'])] == 0.0
    assert decay[id(named['backbone.patch_embed.proj.1.weight'])] == 0.0  # stem BatchNorm
    for name in (blk + 'retention.q_proj.weight', blk + 'ffn.fc1.weight', 'neck.lateral_convs.0.conv.weight'):
        assert decay[id(named[name])] == pytest.approx(0.05), name
