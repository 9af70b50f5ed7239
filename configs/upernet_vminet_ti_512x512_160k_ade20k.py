# UPerNet with a VMINet-Ti backbone on ADE20K, 512x512, 160k iterations; recipe in
# ./_base_/upernet_vminet_160k.py.
# The paper reports segmentation for XS/S/B only; Ti takes the same recipe.
_base_ = './_base_/upernet_vminet_160k.py'

pretrained = 'checkpoints/vminet_ti_in1k.pth'  # configs/vminet_ti_8xb128_in1k.py
model = dict(
    backbone=dict(arch='ti', init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[24, 48, 96, 192]), auxiliary_head=dict(in_channels=96))
