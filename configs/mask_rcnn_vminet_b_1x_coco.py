# Mask R-CNN 1x with a VMINet-B backbone on COCO; recipe in ./_base_/mask_rcnn_vminet_1x.py.
_base_ = './_base_/mask_rcnn_vminet_1x.py'

pretrained = 'checkpoints/vminet_b_in1k.pth'  # configs/vminet_b_8xb128_in1k.py
model = dict(
    backbone=dict(arch='b', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 384, 768]))
