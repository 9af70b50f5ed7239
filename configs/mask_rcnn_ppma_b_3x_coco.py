# Mask R-CNN 3x with a PPMA-B backbone on COCO; recipe in ./_base_/det_mask_rcnn_3x.py.
_base_ = './_base_/det_mask_rcnn_3x.py'

pretrained = 'checkpoints/ppma_b_in1k.pth'  # configs/ppma_b_8xb128_in1k.py
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.4, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[80, 160, 320, 512]))
