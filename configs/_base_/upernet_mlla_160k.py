# UPerNet with an MLLA backbone on ADE20K, 512x512, 160k iterations: ./seg_upernet_160k.py (AdamW 6e-5, 1500
# warmup iterations, poly, batch 16) with the release's weight decay 0.01
# (downstream/segmentation/configs/mlla/mlla_b_upernet.py; the release ships B only, T/S take its recipe with
# their ImageNet drop path rates; B's 0.5 is its ImageNet rate too). Per-arch configs
# (configs/upernet_mlla_{t,s,b}_512x512_160k_ade20k.py) set only the arch, drop_path_rate, the ImageNet-1K
# weights (top-level `pretrained`: an mmppma classification checkpoint, or a release one converted with
# tools/model_converters/release_to_mmppma.py --family MLLA) and the heads' in_channels.
_base_ = './seg_upernet_160k.py'

model = dict(backbone=dict(type='mmppma.MLLA'))

optim_wrapper = dict(optimizer=dict(weight_decay=0.01))
