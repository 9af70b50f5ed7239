# UPerNet with a VMINet-XS backbone on ADE20K, 512x512, 160k iterations; recipe in
# ./_base_/upernet_vminet_160k.py.
_base_ = './_base_/upernet_vminet_160k.py'

pretrained = 'checkpoints/vminet_xs_in1k.pth'  # configs/vminet_xs_8xb128_in1k.py
model = dict(
    backbone=dict(arch='xs', init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[48, 96, 192, 384]), auxiliary_head=dict(in_channels=192))
