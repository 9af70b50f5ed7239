# Mask R-CNN 1x with a PPMA-S backbone on COCO; recipe in ./_base_/det_mask_rcnn_1x.py.
_base_ = './_base_/det_mask_rcnn_1x.py'

pretrained = 'checkpoints/ppma_s_in1k.pth'  # configs/ppma_s_8xb128_in1k.py
model = dict(
    backbone=dict(arch='small', drop_path_rate=0.15, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 256, 512]))
