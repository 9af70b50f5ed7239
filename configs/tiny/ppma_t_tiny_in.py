# PPMA-T classification on the tiny ImageNet-layout shapes set (tools/make_tiny_datasets.py), sized for a
# CPU: 64 px crops, batch 8, iteration-based, fp32. Everything else is the real recipe
# (../ppma_t_8xb128_in1k.py: PPMAClsHead, label smoothing, mixup/cutmix, AdamW with the release's
# weight-decay exclusions, EMA). Needs mmpretrain's data pipeline, which imports torchvision.
# Data root: $MMPPMA_TINY_DATA (default data/tiny, relative to the working directory).
_base_ = '../ppma_t_8xb128_in1k.py'

data_root = '{{$MMPPMA_TINY_DATA:data/tiny}}/imagenet'
classes = ('circle', 'square', 'triangle', 'ring')
num_classes = 4
crop = 64
max_iters = 200
val_interval = 100

data_preprocessor = dict(num_classes=num_classes)
model = dict(head=dict(num_classes=num_classes))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=crop, crop_ratio_range=(0.5, 1.0), backend='pillow'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=crop, edge='short', backend='pillow'),
    dict(type='CenterCrop', crop_size=crop),
    dict(type='PackInputs'),
]
dataset = dict(_delete_=True, type='CustomDataset', data_root=data_root, classes=classes)
train_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(_delete_=True, type='DefaultSampler', shuffle=True),
    dataset=dict(**dataset, ann_file='meta/train.txt', data_prefix='train', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(**dataset, ann_file='meta/val.txt', data_prefix='val', pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(topk=(1, ))  # top-5 is meaningless with 4 classes
test_evaluator = val_evaluator

# fp32 on CPU; lr 1e-3 as the recipe (for a batch of 1024) is fine for this small, easy set
optim_wrapper = dict(type='OptimWrapper')
train_cfg = dict(_delete_=True, by_epoch=False, max_iters=max_iters, val_interval=val_interval)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-2, by_epoch=False, begin=0, end=20),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=20, end=max_iters),
]
# the recipe's EMA (momentum 1e-4) would hardly leave the initialization in 200 steps, and validation uses it
custom_hooks = [dict(type='EMAHook', momentum=0.02, priority='ABOVE_NORMAL')]
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(by_epoch=False, interval=val_interval, max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
