# UPerNet with an RMT-T backbone (the fixed-decay baseline) on ADE20K, 512x512, 160k iterations; recipe in
# ./_base_/seg_upernet_160k.py.
_base_ = './_base_/seg_upernet_160k.py'

pretrained = 'checkpoints/rmt_t_in1k.pth'  # configs/rmt_t_8xb128_in1k.py
model = dict(
    backbone=dict(type='mmppma.RMT', arch='tiny', drop_path_rate=0.1, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[64, 128, 256, 512]), auxiliary_head=dict(in_channels=256))
