# UPerNet with an MLLA-B backbone on ADE20K, 512x512, 160k iterations: ./_base_/seg_upernet_160k.py
# (AdamW 6e-5, 1500 warmup iterations, poly, batch 16) with the release's weight decay 0.01
# (downstream/segmentation/configs/mlla/mlla_b_upernet.py; the release ships B only, T/S take its recipe
# with their ImageNet drop path rates; B's 0.5 is its ImageNet rate too).
_base_ = './_base_/seg_upernet_160k.py'

# ImageNet-1K weights: an mmppma classification checkpoint (configs/mlla_b_8xb128_in1k.py), or a release
# one converted with tools/model_converters/mlla_official_to_mmppma.py. None trains from scratch.
pretrained = 'checkpoints/mlla_b_in1k.pth'

model = dict(
    backbone=dict(
        type='mmppma.MLLA',
        arch='base',
        drop_path_rate=0.5,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.') if pretrained else None),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))

optim_wrapper = dict(optimizer=dict(weight_decay=0.01))
