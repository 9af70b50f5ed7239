# UPerNet with a PPMA-B backbone on ADE20K, 512x512, 160k iterations; recipe in
# ./_base_/seg_upernet_160k.py.
_base_ = './_base_/seg_upernet_160k.py'

pretrained = 'checkpoints/ppma_b_in1k.pth'  # configs/ppma_b_8xb128_in1k.py
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.4, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[80, 160, 320, 512]), auxiliary_head=dict(in_channels=320))
