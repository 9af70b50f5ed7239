"""Every config under configs/ loads and builds its model; each carries its release's recipe (docs/method.md §9,
the MLLA and VMINet release scripts) and per-arch settings consistent with the backbone's arch table."""
import argparse
import re
from pathlib import Path

import pytest
import torch
from mmengine.config import Config, DictAction
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODELS, DefaultScope

from mmppma.models import MLLA, PPMA, VMINet
from mmppma.utils import register_scope_modules

from .conftest import CONFIGS, TINY_DET

ALL_CONFIGS = sorted(p for p in CONFIGS.rglob('*.py') if '_base_' not in p.parts)
IN1K = sorted(CONFIGS.glob('*_8xb128_in1k.py'))
DENSE = sorted(p for pattern in ('mask_rcnn_*_coco.py', 'upernet_*_ade20k.py') for p in CONFIGS.glob(pattern))
ZOO = {'ppma': PPMA, 'rmt': PPMA, 'mlla': MLLA, 'ppmla': MLLA, 'vminet': VMINet}
SIZES = {'t': ('tiny', 0), 's': ('small', 1), 'b': ('base', 2)}  # size -> (arch, index); VMINet's: itself


def family_size(path: Path):
    """('ppma', 't') from configs/mask_rcnn_ppma_t_1x_coco.py, upernet_..., ppma_t_8xb128_in1k.py."""
    return re.search(r'(?:^|_)(ppma|rmt|mlla|ppmla|vminet)_(ti|xs|t|s|b)_', path.name).groups()


def arch_and_index(family: str, size: str):
    return (size, ('ti', 'xs', 's', 'b').index(size)) if family == 'vminet' else SIZES[size]


def in1k_facts(cfg: Config) -> dict:
    opt, bb, head = cfg.optim_wrapper, cfg.model.backbone, cfg.model.head
    pipeline = {t.type: t for t in cfg.train_dataloader.dataset.pipeline}
    warmup, cosine = cfg.param_scheduler
    return dict(
        scope=cfg.default_scope, out=(tuple(bb.get('out_indices', (3, ))), bb.get('out_norm')),
        neck=(cfg.model.get('neck') or {}).get('type'), head=(head.type, head.num_classes),
        smooth=head.loss.label_smooth_val if 'label_smooth_val' in head.loss else None,
        augments=[(a.type, a.alpha) for a in cfg.model.train_cfg.augments],
        optim=(opt.type, opt.optimizer.type, opt.optimizer.lr, opt.optimizer.weight_decay),
        no_decay=sorted(opt.get('paramwise_cfg', {}).get('no_decay_names', [])),
        clip=opt.get('clip_grad', {}).get('max_norm'), base_batch=cfg.auto_scale_lr.base_batch_size,
        batch=(cfg.train_dataloader.batch_size, cfg.train_dataloader.sampler.type),
        warmup=(warmup.type, warmup.start_factor, warmup.end), cosine=(cosine.type, cosine.eta_min),
        epochs=cfg.train_cfg.max_epochs, ema=[h.momentum for h in cfg.get('custom_hooks', []) if h.type == 'EMAHook'],
        rand_aug=(pipeline['RandAugment'].magnitude_level, pipeline['RandAugment'].get('magnitude_std')),
        erase=pipeline['RandomErasing'].erase_prob, color_jitter='ColorJitter' in pipeline)


PPMA_IN1K = dict(
    scope='mmpretrain', out=((3, ), False), neck=None, head=('mmppma.PPMAClsHead', 1000), smooth=0.1,
    augments=[('Mixup', 0.8), ('CutMix', 1.0)], optim=('AmpOptimWrapper', 'AdamW', 1e-3, 0.05),
    no_decay=['A_log', 'dt_bias'], clip=None, base_batch=1024, batch=(128, 'RepeatAugSampler'),
    warmup=('LinearLR', 1e-3, 5), cosine=('CosineAnnealingLR', 1e-5), epochs=300, ema=[1e-4], rand_aug=(9, 0.5),
    erase=0.25, color_jitter=False)
MLLA_IN1K = dict(PPMA_IN1K, out=((3, ), True), neck='GlobalAveragePooling', head=('LinearClsHead', 1000), clip=5.0,
                 batch=(128, 'DefaultSampler'), warmup=('LinearLR', 1e-3, 20))
IN1K_RECIPES = {
    'ppma': PPMA_IN1K, 'rmt': PPMA_IN1K, 'mlla': MLLA_IN1K, 'ppmla': MLLA_IN1K,
    'vminet': dict(MLLA_IN1K, out=((3, ), 'BN'), augments=[('Mixup', 0.8), ('CutMix', 0.2)],
                   optim=('OptimWrapper', 'AdamW', 1e-3, 0.025), no_decay=[], clip=None, base_batch=768,
                   warmup=('LinearLR', 1e-3, 5), epochs=310, ema=[], rand_aug=(1, 0.5)),
}
IN1K_DROP_PATH = {'ppma': (0.1, 0.15, 0.4), 'rmt': (0.1, 0.15, 0.4), 'mlla': (0.2, 0.3, 0.5), 'ppmla': (0.2, ),
                  'vminet': (0.0, 0.0, 0.0, 0.0)}


@pytest.mark.parametrize('path', IN1K, ids=lambda p: p.name)
def test_in1k_recipe(path):
    family, size = family_size(path)
    (arch, index), cfg = arch_and_index(family, size), Config.fromfile(str(path))
    bb = cfg.model.backbone
    assert bb.type == f'mmppma.{"RMT" if family == "rmt" else ZOO[family].__name__}'
    assert bb.arch == arch and bb.get('mask') == ('polyline' if family == 'ppmla' else None)
    assert bb.drop_path_rate == IN1K_DROP_PATH[family][index]
    assert cfg.model.head.in_channels == ZOO[family].arch_zoo[arch]['embed_dims'][-1]
    assert in1k_facts(cfg) == IN1K_RECIPES[family]
    if family == 'ppmla':  # MLLA-T's model with the polyline mask
        mlla = Config.fromfile(str(CONFIGS / 'mlla_t_8xb128_in1k.py')).model
        assert cfg.model.backbone.pop('mask') == 'polyline' and cfg.model.to_dict() == mlla.to_dict()


def dense_facts(cfg: Config, det: bool) -> dict:
    opt, sched = cfg.optim_wrapper, cfg.param_scheduler
    paramwise = opt.get('paramwise_cfg', {})
    facts = dict(optim=(opt.type, opt.optimizer.type, opt.optimizer.lr, opt.optimizer.weight_decay),
                 norm_decay=paramwise.get('norm_decay_mult'),
                 custom=sorted((k, v.decay_mult) for k, v in paramwise.get('custom_keys', {}).items()),
                 batch=cfg.train_dataloader.batch_size, base_batch=cfg.get('auto_scale_lr', {}).get('base_batch_size'))
    if det:
        pipeline = cfg.train_dataloader.dataset.pipeline
        choice = [t for t in pipeline if t.type == 'RandomChoice']
        facts.update(scope_type=(cfg.default_scope, cfg.model.type), metric=sorted(cfg.val_evaluator.metric),
                     warmup=(sched[0].type, sched[0].end, sched[0].by_epoch),
                     schedule=(cfg.train_cfg.max_epochs, sched[1].milestones),
                     scales=sorted(tuple(s) for s in choice[0].transforms[0][0].scales) if choice else
                     [t.scale for t in pipeline if t.type == 'Resize'])
    else:
        facts.update(scope_type=(cfg.default_scope, cfg.model.type), crop=cfg.crop_size,
                     iters=cfg.train_cfg.max_iters, classes=cfg.model.decode_head.num_classes,
                     metric=cfg.val_evaluator.type, pretrained=cfg.model.pretrained,
                     warmup=(sched[0].type, sched[0].start_factor, sched[0].end),
                     poly=(sched[1].type, sched[1].power, sched[1].eta_min, sched[1].begin, sched[1].end))
    return facts


MULTI_SCALE = [(s, 1333) for s in range(480, 801, 32)]
PPMA_DET = dict(optim=('AmpOptimWrapper', 'AdamW', 1e-4, 0.05), norm_decay=0.0,
                custom=[('.A_log', 0.0), ('.dt_bias', 0.0)], batch=2, base_batch=16, scope_type=('mmdet', 'MaskRCNN'),
                metric=['bbox', 'segm'], warmup=('LinearLR', 500, False), schedule=(12, [8, 11]),
                scales=[(1333, 800)])
PPMA_SEG = dict(optim=('AmpOptimWrapper', 'AdamW', 6e-5, 0.05), norm_decay=0.0,
                custom=[('.A_log', 0.0), ('.dt_bias', 0.0)], batch=2, base_batch=16,
                scope_type=('mmseg', 'EncoderDecoder'), crop=(512, 512), iters=160000, classes=150,
                metric='IoUMetric', pretrained=None, warmup=('LinearLR', 1e-6, 1500),
                poly=('PolyLR', 1.0, 0.0, 1500, 160000))
DENSE_RECIPES = {
    ('ppma', '1x'): PPMA_DET, ('ppma', '3x'): dict(PPMA_DET, schedule=(36, [27, 33]), scales=MULTI_SCALE),
    ('mlla', '1x'): dict(PPMA_DET, scales=MULTI_SCALE), ('vminet', '1x'): PPMA_DET, ('ppma', 'seg'): PPMA_SEG,
    ('mlla', 'seg'): dict(PPMA_SEG, optim=('AmpOptimWrapper', 'AdamW', 6e-5, 0.01)),
    ('vminet', 'seg'): dict(PPMA_SEG, optim=('AmpOptimWrapper', 'AdamW', 6e-5, 0.01)),
}
RECIPE_OF = {'ppma': 'ppma', 'rmt': 'ppma', 'mlla': 'mlla', 'ppmla': 'mlla', 'vminet': 'vminet'}
DENSE_DROP_PATH = {'ppma': (0.1, 0.15, 0.4), 'rmt': (0.1, 0.15, 0.4), 'mlla': (0.1, 0.1, 0.1), 'ppmla': (0.1, )}
SEG_DROP_PATH = dict(DENSE_DROP_PATH, mlla=(0.2, 0.3, 0.5), ppmla=(0.2, ))


@pytest.mark.parametrize('path', DENSE, ids=lambda p: p.name)
def test_dense_recipe_and_per_arch_settings(path):
    """The recipe; type / arch / drop path from the file name; neck / head channels the arch's; ImageNet weights
    through the backbone's init_cfg, which ``--cfg-options model.backbone.init_cfg=None`` removes."""
    (family, size), det, cfg = family_size(path), path.name.startswith('mask_rcnn'), Config.fromfile(str(path))
    schedule = ('3x' if '_3x_' in path.name else '1x') if det else 'seg'
    assert dense_facts(cfg, det) == DENSE_RECIPES[RECIPE_OF[family], schedule]
    bb, (arch, index) = cfg.model.backbone, arch_and_index(family, size)
    dims = ZOO[family].arch_zoo[arch]['embed_dims']
    assert bb.type.startswith('mmppma.') and bb.arch == arch and tuple(bb.out_indices) == (0, 1, 2, 3)
    assert bb.get('mask') == ('polyline' if family == 'ppmla' else None)
    if family == 'vminet':
        assert bb.out_norm == 'LN' and bb.norm_eval
    else:
        assert bb.drop_path_rate == (DENSE_DROP_PATH if det else SEG_DROP_PATH)[family][index]
    if det:
        assert cfg.model.neck.in_channels == dims
    else:
        assert cfg.model.decode_head.in_channels == dims and cfg.model.auxiliary_head.in_channels == dims[2]
    assert cfg.pretrained == f'checkpoints/{family}_{size}_in1k.pth'
    assert bb.init_cfg == dict(type='Pretrained', checkpoint=cfg.pretrained, prefix='backbone.')
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg.merge_from_dict(parser.parse_args(['--cfg-options', 'model.backbone.init_cfg=None']).cfg_options)
    assert cfg.model.backbone.init_cfg is None


def test_every_family_has_its_configs():
    assert {family_size(p)[0] for p in IN1K} == {family_size(p)[0] for p in DENSE} == set(ZOO)


def scope_ready(scope: str) -> None:
    try:
        register_scope_modules(scope)
    except ImportError as e:
        pytest.skip(f'default_scope {scope!r} is not usable here: {e}')


@pytest.mark.parametrize('path', ALL_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_config_loads_and_builds(path):
    cfg = Config.fromfile(str(path))
    scope = cfg.default_scope
    scope_ready(scope)
    with DefaultScope.overwrite_default_scope(scope), torch.device('meta'):  # the structure, not the values
        model = MODELS.build(cfg.model)
    backbone = model.backbone
    assert type(backbone).__name__ == cfg.model.backbone.type.split('.')[-1]
    assert sum(p.numel() for p in backbone.parameters()) > 1e6


@pytest.mark.parametrize('path, checks', [
    (TINY_DET, {'retention.path_embed.A_log': 0.0, 'retention.path_embed.dt_bias': 0.0,
                'retention_layer_norm.weight': 0.0, 'final_layer_norm.bias': 0.0, 'retention.q_proj.weight': 0.05,
                'ffn.fc1.weight': 0.05}),
    (CONFIGS / 'vminet_ti_8xb128_in1k.py', {'stack': 0.0, 'f1.conv.bias': 0.0, 'dwconv.bn.weight': 0.0,
                                            'f1.conv.weight': 0.025, 'sum.weight': 0.025})],
    ids=['det', 'vminet-in1k'])
def test_weight_decay_exclusions_in_the_built_optimizer(path, checks, tiny_env):
    """The recipe's paramwise_cfg on the real model: no decay on norms, biases (VMINet), ``stack``, A_log and
    dt_bias; decay on Linear / conv weights."""
    cfg = Config.fromfile(str(path))
    scope_ready(cfg.default_scope)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model)
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    decay = {id(p): g['weight_decay'] for g in wrapper.optimizer.param_groups for p in g['params']}
    named = dict(model.named_parameters())
    assert len(decay) == len(named)
    stage = getattr(model.backbone, model.backbone.stages_name)[2]
    block = dict(stage.blocks[0].named_parameters())
    for name, want in checks.items():
        assert decay[id(block[name])] == pytest.approx(want), name
    out_norm = model.backbone.out_norm_module(3)
    assert all(decay[id(p)] == 0.0 for p in out_norm.parameters())
