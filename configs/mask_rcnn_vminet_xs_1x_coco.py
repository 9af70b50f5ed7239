# Mask R-CNN 1x with a VMINet-XS backbone on COCO; recipe in ./_base_/det_mask_rcnn_1x.py (AdamW 1e-4, wd .05,
# 12 epochs, as Swin's; the paper's detection settings follow Swin). Our choices, the release having no
# detection code: mmdet's FPN on all four stages (the paper uses a ViTDet-style simple pyramid from the last
# map), per-stage LayerNorm outputs, BatchNorm statistics frozen (2 images per GPU), drop path 0.1.
_base_ = './_base_/det_mask_rcnn_1x.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/vminet_xs_8xb128_in1k.py), or a release
# one converted with tools/model_converters/vminet_official_to_mmppma.py. None trains from scratch.
pretrained = 'checkpoints/vminet_xs_in1k.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmppma.VMINet',
        arch='xs',
        out_indices=(0, 1, 2, 3),
        out_norm='LN',
        norm_eval=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    neck=dict(in_channels=[48, 96, 192, 384]))
