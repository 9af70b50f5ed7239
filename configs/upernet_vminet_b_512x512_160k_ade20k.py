# UPerNet with a VMINet-B backbone on ADE20K, 512x512, 160k iterations; recipe in
# ./_base_/upernet_vminet_160k.py.
_base_ = './_base_/upernet_vminet_160k.py'

pretrained = 'checkpoints/vminet_b_in1k.pth'  # configs/vminet_b_8xb128_in1k.py
model = dict(
    backbone=dict(arch='b', init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 768]), auxiliary_head=dict(in_channels=384))
