# Mask R-CNN 3x with an RMT-S backbone (the fixed-decay baseline) on COCO; recipe in ./_base_/det_mask_rcnn_3x.py.
_base_ = './_base_/det_mask_rcnn_3x.py'

pretrained = 'checkpoints/rmt_s_in1k.pth'  # configs/rmt_s_8xb128_in1k.py
model = dict(
    backbone=dict(type='mmppma.RMT', arch='small', drop_path_rate=0.15, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 256, 512]))
