# Mask R-CNN 1x with an MLLA backbone on COCO, as the release's downstream/detection configs
# (configs/mlla/mlla_{t,s,b}_mrcnn_1x.py): AdamW 1e-4, wd 0.05 (none on norms), batch 16, 12 epochs with steps
# at 8 and 11, drop path 0.1, and, unlike plain 1x, the multi-scale (short side 480-800) + random-crop training
# pipeline of ./det_mask_rcnn_3x.py, which this recipe takes with the 1x schedule. Per-arch configs
# (configs/mask_rcnn_mlla_{t,s,b}_1x_coco.py) set only the arch, the ImageNet-1K weights (top-level
# `pretrained`: an mmppma classification checkpoint, or a release one converted with
# tools/model_converters/release_to_mmppma.py --family MLLA) and the FPN's in_channels.
_base_ = './det_mask_rcnn_3x.py'

model = dict(backbone=dict(type='mmppma.MLLA', drop_path_rate=0.1))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
