# Mask R-CNN 1x with a VMINet-Ti backbone on COCO; recipe in ./_base_/mask_rcnn_vminet_1x.py.
# The paper reports detection for XS/S/B only; Ti takes the same recipe.
_base_ = './_base_/mask_rcnn_vminet_1x.py'

pretrained = 'checkpoints/vminet_ti_in1k.pth'  # configs/vminet_ti_8xb128_in1k.py
model = dict(
    backbone=dict(arch='ti', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[24, 48, 96, 192]))
