# UPerNet with a VMINet-B backbone on ADE20K, 512x512, 160k iterations; recipe in ./_base_/seg_upernet_160k.py
# (batch 16, 1500 warmup iterations, linear decay), with the paper's weight decay 0.01. Our choices, the
# release having no segmentation code: per-stage LayerNorm outputs, BatchNorm statistics frozen (2 images per
# GPU), drop path 0.1, and the base's lr 6e-5 (the paper's value is not legible in its text).
_base_ = './_base_/seg_upernet_160k.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/vminet_b_8xb128_in1k.py), or a release
# one converted with tools/model_converters/vminet_official_to_mmppma.py. None trains from scratch.
pretrained = 'checkpoints/vminet_b_in1k.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmppma.VMINet',
        arch='b',
        out_indices=(0, 1, 2, 3),
        out_norm='LN',
        norm_eval=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))

optim_wrapper = dict(optimizer=dict(weight_decay=0.01))
