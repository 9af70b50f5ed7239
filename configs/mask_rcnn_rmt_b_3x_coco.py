# Mask R-CNN 3x with an RMT-B backbone (the fixed-decay baseline) on COCO; recipe in ./_base_/det_mask_rcnn_3x.py.
_base_ = './_base_/det_mask_rcnn_3x.py'

pretrained = 'checkpoints/rmt_b_in1k.pth'  # configs/rmt_b_8xb128_in1k.py
model = dict(
    backbone=dict(type='mmppma.RMT', arch='base', drop_path_rate=0.4, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[80, 160, 320, 512]))
