# VMINet's ImageNet-1K recipe, the one place for its numbers: the release's command (github.com/yws-wxs/VMINet,
# README: train_imagenet.py -b 256 --lr 1e-3 --weight-decay 0.025 --aa rand-m1-mstd0.5-inc1 --cutmix 0.2
# --color-jitter 0. --drop-path 0., on 3 GPUs) with its timm script's defaults for everything else (AdamW,
# cosine, 5 warmup epochs from 1e-6, min lr 1e-5, 300 epochs + 10 cooldown, label smoothing 0.1, mixup 0.8,
# random erasing 0.25 per pixel, bicubic 224 crops / 256 resize at test, no EMA, no AMP, no grad clipping).
# Model configs (configs/vminet_{ti,xs,s,b}_8xb128_in1k.py) set only the backbone arch and the head width.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/default_runtime.py',  # default_scope = 'mmpretrain'
]

model = dict(
    type='ImageClassifier',
    # the release classifier: BatchNorm2d over the last map (norm3, release `norm`), average pool, Linear
    backbone=dict(type='mmppma.VMINet', arch='xs', drop_path_rate=0.0, out_indices=(3, ), out_norm='BN'),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=384,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),  # release head init
        cal_acc=False),
    # timm Mixup(mixup_alpha=0.8, cutmix_alpha=0.2, switch_prob=0.5): one of the two per batch, equally likely
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=0.2)]),
)

# RandAugment rand-m1-mstd0.5-inc1 (two increasing-magnitude ops, magnitude 1 +- 0.5); no color jitter
bgr_mean = [103.53, 116.28, 123.675]
bgr_std = [57.375, 57.12, 58.395]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(
        type='RandAugment',
        policies='timm_increasing',
        num_policies=2,
        total_level=10,
        magnitude_level=1,
        magnitude_std=0.5,
        hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic')),
    dict(
        type='RandomErasing',
        erase_prob=0.25,
        mode='rand',
        min_area_ratio=0.02,
        max_area_ratio=1 / 3,
        fill_color=bgr_mean,
        fill_std=bgr_std),
    dict(type='PackInputs'),
]
# 8 x 128 = 1024 images per step; the release's 1e-3 is for its 3 x 256 = 768 (auto_scale_lr below)
train_dataloader = dict(batch_size=128, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader

# AdamW 1e-3, wd 0.025; no weight decay on 1-D parameters (biases, BatchNorm, the block's `stack`), as timm's
# filter_bias_and_bn; the context weight tables (`sum.weight`, 2-D) are decayed, as in the release.
# fp32 as the release command (no --amp); `tools/train.py --amp` switches to AmpOptimWrapper.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.025, eps=1e-8, betas=(0.9, 0.999)),
    constructor='mmppma.LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=1.0, no_decay_names=[]),
)

# 5 linear warmup epochs from 1e-6, cosine to 1e-5 at epoch 300, then timm's 10 cooldown epochs at 1e-5
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=300, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=310, val_interval=1)
val_cfg = dict()
test_cfg = dict()

# `--auto-scale-lr` rescales lr from the release's total batch 768 to the actual one
auto_scale_lr = dict(base_batch_size=768)

# CUDA graphs: `compile = dict(mode='reduce-overhead')` here (or `--cfg-options compile.mode=reduce-overhead`)
# compiles train_step with inductor and replays its launches as CUDA graphs. The first steps compile and record,
# the graphs keep a memory pool of their own, and each new input shape (a smaller last batch) records again;
# Mixup / CutMix draw numbers on the host and split the step into several graphs. README "torch.compile".
