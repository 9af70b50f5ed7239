# Mask R-CNN 1x with a VMINet-XS backbone on COCO; recipe in ./_base_/mask_rcnn_vminet_1x.py.
_base_ = './_base_/mask_rcnn_vminet_1x.py'

pretrained = 'checkpoints/vminet_xs_in1k.pth'  # configs/vminet_xs_8xb128_in1k.py
model = dict(
    backbone=dict(arch='xs', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[48, 96, 192, 384]))
