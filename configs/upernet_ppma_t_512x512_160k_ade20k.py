# UPerNet with a PPMA-T backbone on ADE20K, 512x512, 160k iterations; recipe in ./_base_/seg_upernet_160k.py.
_base_ = './_base_/seg_upernet_160k.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/ppma_t_8xb128_in1k.py, or an official one
# converted with tools/model_converters/ppma_official_to_mmppma.py). None trains from scratch.
pretrained = 'checkpoints/ppma_t_in1k.pth'

model = dict(
    backbone=dict(
        type='mmppma.PPMA',
        arch='tiny',
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))
