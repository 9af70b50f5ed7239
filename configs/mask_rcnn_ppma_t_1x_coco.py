# Mask R-CNN 1x with a PPMA-T backbone on COCO; recipe in ./_base_/det_mask_rcnn_1x.py.
_base_ = './_base_/det_mask_rcnn_1x.py'

pretrained = 'checkpoints/ppma_t_in1k.pth'  # configs/ppma_t_8xb128_in1k.py
model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.1, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 256, 512]))
