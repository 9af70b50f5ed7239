# Mask R-CNN 1x with an RMT-T backbone (the fixed-decay baseline) on COCO; recipe in ./_base_/det_mask_rcnn_1x.py.
_base_ = './_base_/det_mask_rcnn_1x.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/rmt_t_8xb128_in1k.py, or an official one
# converted with tools/model_converters/ppma_official_to_mmppma.py). None trains from scratch.
pretrained = 'checkpoints/rmt_t_in1k.pth'

model = dict(
    backbone=dict(
        type='mmppma.RMT',
        arch='tiny',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    neck=dict(in_channels=[64, 128, 256, 512]))
