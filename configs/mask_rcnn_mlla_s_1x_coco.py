# Mask R-CNN 1x with an MLLA-S backbone on COCO; recipe in ./_base_/mask_rcnn_mlla_1x.py.
_base_ = './_base_/mask_rcnn_mlla_1x.py'

pretrained = 'checkpoints/mlla_s_in1k.pth'  # configs/mlla_s_8xb128_in1k.py
model = dict(
    backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 256, 512]))
