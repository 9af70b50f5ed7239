# The release's ImageNet-1K recipe (docs/method.md §9), the one place for its numbers. Model configs inherit this
# and set only the backbone (type, arch, drop_path_rate). Total batch 1024 (8 GPUs x 128).
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',  # RandAugment m9 (mstd .5), RandomErasing .25
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',  # default_scope = 'mmpretrain'
]

model = dict(
    type='ImageClassifier',
    # classification release checkpoints have no output norms; the head reads the last stage's map
    backbone=dict(type='mmppma.PPMA', arch='tiny', drop_path_rate=0.1, out_indices=(3, ), out_norm=False),
    neck=None,
    head=dict(
        type='mmppma.PPMAClsHead',
        num_classes=1000,
        in_channels=512,
        hidden_channels=1024,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]),
)

train_dataloader = dict(batch_size=128, sampler=dict(type='RepeatAugSampler', shuffle=True, _delete_=True))
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader

# AdamW 1e-3 @ 1024, wd .05; no weight decay on 1-D params, biases, norms, A_log, dt_bias; AMP.
optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    constructor='mmppma.LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(_delete_=True, layer_decay_rate=1.0, no_decay_names=['A_log', 'dt_bias']),
)

# 5 warmup epochs (linear, per iteration), then cosine to 1e-5; 300 epochs
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=300, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)

# EMA of the weights (decay 0.9999); evaluation uses the EMA model
custom_hooks = [dict(type='EMAHook', momentum=1e-4, priority='ABOVE_NORMAL')]

auto_scale_lr = dict(base_batch_size=1024)

# CUDA graphs: `compile = dict(mode='reduce-overhead')` here (or `--cfg-options compile.mode=reduce-overhead`)
# compiles train_step with inductor and replays its launches as CUDA graphs. The first steps compile and record,
# the graphs keep a memory pool of their own, and each new input shape (a smaller last batch) records again;
# Mixup / CutMix draw numbers on the host and split the step into several graphs. README "torch.compile".
