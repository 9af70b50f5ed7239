# UPerNet with a VMINet-Ti backbone on ADE20K, 512x512, 160k iterations: the VMINet-XS recipe
# (./upernet_vminet_xs_512x512_160k_ade20k.py; the paper reports segmentation for XS/S/B only) with Ti's stage
# widths 24/48/96/192.
_base_ = './upernet_vminet_xs_512x512_160k_ade20k.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/vminet_ti_8xb128_in1k.py), or a release
# one converted with tools/model_converters/vminet_official_to_mmppma.py. None trains from scratch.
pretrained = 'checkpoints/vminet_ti_in1k.pth'

model = dict(
    backbone=dict(
        arch='ti',
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    decode_head=dict(in_channels=[24, 48, 96, 192]),
    auxiliary_head=dict(in_channels=96))
