# Mask R-CNN 1x with a VMINet-Ti backbone on COCO: the VMINet-XS recipe (./mask_rcnn_vminet_xs_1x_coco.py; the
# paper reports detection for XS/S/B only) with Ti's stage widths 24/48/96/192.
_base_ = './mask_rcnn_vminet_xs_1x_coco.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/vminet_ti_8xb128_in1k.py), or a release
# one converted with tools/model_converters/vminet_official_to_mmppma.py. None trains from scratch.
pretrained = 'checkpoints/vminet_ti_in1k.pth'

model = dict(
    backbone=dict(
        arch='ti',
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    neck=dict(in_channels=[24, 48, 96, 192]))
