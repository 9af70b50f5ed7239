# PPMA-T UPerNet on the tiny ADE20K-layout shapes set (tools/make_tiny_datasets.py), sized for a CPU:
# 128 px crops, batch 2, no pretraining, BN instead of SyncBN in the heads and narrower heads (128/64
# channels instead of 512/256). Everything else is the real config (../upernet_ppma_t_512x512_160k_ade20k.py:
# AdamW with the recipe's weight-decay exclusions, warmup + poly schedule, IoUMetric mIoU).
# Data root: $MMPPMA_TINY_DATA (default data/tiny, relative to the working directory).
_base_ = '../upernet_ppma_t_512x512_160k_ade20k.py'

data_root = '{{$MMPPMA_TINY_DATA:data/tiny}}/ade'
# label PNGs: 0 unlabeled (ignored through reduce_zero_label, as in ADE20K), 1..4 the classes below
metainfo = dict(
    classes=('wall', 'circle', 'square', 'triangle'),
    palette=[[120, 120, 120], [220, 40, 40], [40, 190, 40], [30, 90, 220]])
num_classes = 4
crop_size = (128, 128)
max_iters = 200
val_interval = 100
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(init_cfg=None),  # no ImageNet weights here
    decode_head=dict(channels=128, num_classes=num_classes, norm_cfg=norm_cfg),
    auxiliary_head=dict(channels=64, num_classes=num_classes, norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(256, 128), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
dataset = dict(
    _delete_=True,
    type='BaseSegDataset',  # ADE20KDataset would insist on ADE's 150 class names
    data_root=data_root,
    metainfo=metainfo,
    img_suffix='.jpg',
    seg_map_suffix='.png',
    reduce_zero_label=True)
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        **dataset,
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline))
val_dataloader = dict(
    train_dataloader,  # the same loader settings, one image per batch
    batch_size=1,
    dataset=dict(
        **dataset,
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader

# fp32 on CPU; same AdamW and exclusions as the recipe, a higher lr for a short run from scratch
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(lr=2e-4))
warmup_iters = 20
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=val_interval)
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(by_epoch=False, interval=val_interval, max_keep_ckpts=2))
env_cfg = dict(cudnn_benchmark=False)
