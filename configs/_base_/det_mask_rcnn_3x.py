# Mask R-CNN 3x on COCO: the 1x recipe (./det_mask_rcnn_1x.py) trained 36 epochs with multi-scale
# training, short side 480-800 in steps of 32 (long side <= 1333), half of the time after a random crop,
# as mmdet's Swin 3x configs and the release's RMT/PPMA 3x runs do. Steps at epochs 27 and 33.
_base_ = './det_mask_rcnn_1x.py'

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=[(s, 1333) for s in range(480, 801, 32)], keep_ratio=True)],
            [
                dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)], keep_ratio=True),
                dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600), allow_negative_crop=True),
                dict(type='RandomChoiceResize', scales=[(s, 1333) for s in range(480, 801, 32)], keep_ratio=True),
            ],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1),
]
