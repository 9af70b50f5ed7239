# Mask R-CNN 3x with a PPMA-S backbone on COCO; recipe in ./_base_/det_mask_rcnn_3x.py.
_base_ = './_base_/det_mask_rcnn_3x.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/ppma_s_8xb128_in1k.py, or an official one
# converted with tools/model_converters/ppma_official_to_mmppma.py). None trains from scratch.
pretrained = 'checkpoints/ppma_s_in1k.pth'

model = dict(
    backbone=dict(
        type='mmppma.PPMA',
        arch='small',
        drop_path_rate=0.15,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    neck=dict(in_channels=[64, 128, 256, 512]))
