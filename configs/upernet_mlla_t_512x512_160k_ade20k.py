# UPerNet with an MLLA-T backbone on ADE20K, 512x512, 160k iterations; recipe in
# ./_base_/upernet_mlla_160k.py.
_base_ = './_base_/upernet_mlla_160k.py'

pretrained = 'checkpoints/mlla_t_in1k.pth'  # configs/mlla_t_8xb128_in1k.py
model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.2, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[64, 128, 256, 512]), auxiliary_head=dict(in_channels=256))
