# Mask R-CNN 1x with an MLLA-B backbone on COCO, as the release's downstream/detection config
# (configs/mlla/mlla_b_mrcnn_1x.py): AdamW 1e-4, wd 0.05 (none on norms), batch 16, 12 epochs with steps at
# 8 and 11, drop path 0.1, and, unlike plain 1x, the multi-scale (short side 480-800) + random-crop training
# pipeline of ./_base_/det_mask_rcnn_3x.py, which this config takes with the 1x schedule.
_base_ = './_base_/det_mask_rcnn_3x.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/mlla_b_8xb128_in1k.py), or a release
# one converted with tools/model_converters/mlla_official_to_mmppma.py. None trains from scratch.
pretrained = 'checkpoints/mlla_b_in1k.pth'

model = dict(
    backbone=dict(
        type='mmppma.MLLA',
        arch='base',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    neck=dict(in_channels=[96, 192, 384, 768]))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
