# The MLLA release's ImageNet-1K recipe (LeapLabTHU/MLLA: config.py, cfgs/mlla_{t,s,b}.yaml, main.py), the one
# place for its numbers; model configs (configs/mlla_{t,s,b}_8xb128_in1k.py) set only the arch, drop path
# and head width. It is Swin's recipe: AdamW, lr 5e-4 per 512 images (1e-3 at batch 1024 = 8 GPUs x 128;
# the paper's 4e-3 at 4096 is the same rule), wd 0.05 (none on 1-D params, biases, norms), 20 warmup
# epochs from 1e-3 x lr, cosine to 1e-5, 300 epochs, grad-norm clip 5, RandAugment m9 (mstd .5), random
# erasing .25, Mixup .8 / CutMix 1. with label smoothing .1, EMA 0.9996 per 4096 images (0.9999 at 1024),
# AMP, no repeated augmentation. Not reproduced: MESA (EMA-teacher self-distillation from epoch 75, weight
# 1.0 / 1.5 / 2.0 for T/S/B), worth +0.1-0.3 top-1 (paper Table 7: 83.3 / 84.2 / 85.0 without it).
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',  # RandAugment m9 (mstd .5), RandomErasing .25
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',  # default_scope = 'mmpretrain'
]

# The release's head: LayerNorm on the last stage (the backbone's norm3, out_norm=True), global average
# pooling, Linear(C, 1000), trunc_normal(.02) init like every other Linear.
model = dict(
    type='ImageClassifier',
    backbone=dict(type='mmppma.MLLA', arch='tiny', drop_path_rate=0.2, out_indices=(3, ), out_norm=True),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=512,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.0),
        cal_acc=False),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]),
)

train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader

optim_wrapper = dict(
    type='AmpOptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    constructor='mmppma.LayerDecayOptimWrapperConstructor',
    # no weight decay on 1-D params, biases, norms (the constructor's rule) and PPMLA's A_log / dt_bias
    paramwise_cfg=dict(_delete_=True, layer_decay_rate=1.0, no_decay_names=['A_log', 'dt_bias']),
    clip_grad=dict(max_norm=5.0),
)

param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=20, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=20, end=300, convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)

custom_hooks = [dict(type='EMAHook', momentum=1e-4, priority='ABOVE_NORMAL')]

auto_scale_lr = dict(base_batch_size=1024)

# CUDA graphs: `compile = dict(mode='reduce-overhead')` here (or `--cfg-options compile.mode=reduce-overhead`)
# compiles train_step with inductor and replays its launches as CUDA graphs. The first steps compile and record,
# the graphs keep a memory pool of their own, and each new input shape (a smaller last batch) records again;
# Mixup / CutMix draw numbers on the host and split the step into several graphs. README "torch.compile".
