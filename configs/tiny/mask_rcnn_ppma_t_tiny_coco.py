# PPMA-T Mask R-CNN on the tiny COCO-style shapes set (tools/make_tiny_datasets.py), sized for a CPU:
# 192 px images, batch 2, iteration-based, no pretraining. Everything not set here is the real 1x config
# (../mask_rcnn_ppma_t_1x_coco.py: AdamW with the recipe's weight-decay exclusions, FPN, heads, CocoMetric).
# Data root: $MMPPMA_TINY_DATA (default data/tiny, relative to the working directory).
_base_ = '../mask_rcnn_ppma_t_1x_coco.py'

data_root = '{{$MMPPMA_TINY_DATA:data/tiny}}/coco/'
metainfo = dict(classes=('circle', 'square', 'triangle'), palette=[(220, 40, 40), (40, 190, 40), (30, 90, 220)])
num_classes = 3
img_scale = (192, 192)
max_iters = 300
val_interval = 100

model = dict(
    backbone=dict(init_cfg=None),  # no ImageNet weights here
    roi_head=dict(bbox_head=dict(num_classes=num_classes), mask_head=dict(num_classes=num_classes)),
    # at most 4 objects per image: fewer proposals and RoI samples (RoIAlign dominates a CPU step)
    train_cfg=dict(rpn_proposal=dict(nms_pre=1000, max_per_img=300), rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300), rcnn=dict(max_per_img=50)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=8),
        pipeline=train_pipeline))
val_dataloader = dict(
    train_dataloader,  # the same loader settings
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

# fp32 on CPU; same AdamW, weight decay exclusions as the recipe, a higher lr for a short run from scratch
optim_wrapper = dict(type='OptimWrapper', optimizer=dict(lr=2e-4))
# see param_scheduler below
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
# milestone and end follow max_iters here; with --cfg-options train_cfg.max_iters=N also pass
# param_scheduler.1.end=N param_scheduler.1.milestones=[0.8N] (tools/tiny_coco_demo.sh does)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters, milestones=[int(max_iters * 0.8)], gamma=0.1),
]
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(by_epoch=False, interval=val_interval, max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
env_cfg = dict(cudnn_benchmark=False)
