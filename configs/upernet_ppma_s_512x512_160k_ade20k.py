# UPerNet with a PPMA-S backbone on ADE20K, 512x512, 160k iterations; recipe in
# ./_base_/seg_upernet_160k.py.
_base_ = './_base_/seg_upernet_160k.py'

pretrained = 'checkpoints/ppma_s_in1k.pth'  # configs/ppma_s_8xb128_in1k.py
model = dict(
    backbone=dict(arch='small', drop_path_rate=0.15, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[64, 128, 256, 512]), auxiliary_head=dict(in_channels=256))
