# Mask R-CNN 1x with an MLLA-B backbone on COCO; recipe in ./_base_/mask_rcnn_mlla_1x.py.
_base_ = './_base_/mask_rcnn_mlla_1x.py'

pretrained = 'checkpoints/mlla_b_in1k.pth'  # configs/mlla_b_8xb128_in1k.py
model = dict(
    backbone=dict(arch='base', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))
