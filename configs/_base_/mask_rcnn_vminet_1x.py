# Mask R-CNN 1x with a VMINet backbone on COCO; recipe in ./det_mask_rcnn_1x.py (AdamW 1e-4, wd .05, 12 epochs,
# as Swin's; the paper's detection settings follow Swin). Our choices, the release having no detection code:
# mmdet's FPN on all four stages (the paper uses a ViTDet-style simple pyramid from the last map), per-stage
# LayerNorm outputs, BatchNorm statistics frozen (2 images per GPU), drop path 0.1. Per-arch configs
# (configs/mask_rcnn_vminet_{ti,xs,s,b}_1x_coco.py) set only the arch, the ImageNet-1K weights (top-level
# `pretrained`: an mmppma classification checkpoint, or a release one converted with
# tools/model_converters/release_to_mmppma.py --family VMINet) and the FPN's in_channels. A converted release checkpoint
# also needs its revision's backbone options, as configs/vminet_*_release-<revision>_in1k.py set them:
# 6b11d4a context_mask='none', proj_norm=True; 7c2632c context_mask='tril', proj_norm=False (loading it
# with other options is an error naming them). To train from scratch: --cfg-options
# model.backbone.init_cfg=None.
_base_ = './det_mask_rcnn_1x.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmppma.VMINet',
        arch='xs',
        out_indices=(0, 1, 2, 3),
        out_norm='LN',
        norm_eval=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', prefix='backbone.')))
