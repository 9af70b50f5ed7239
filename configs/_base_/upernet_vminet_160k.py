# UPerNet with a VMINet backbone on ADE20K, 512x512, 160k iterations; recipe in ./seg_upernet_160k.py (batch 16,
# 1500 warmup iterations, linear decay), with the paper's weight decay 0.01. Our choices, the release having no
# segmentation code: per-stage LayerNorm outputs, BatchNorm statistics frozen (2 images per GPU), drop path
# 0.1, and the base's lr 6e-5 (the paper's value is not legible in its text). Per-arch configs
# (configs/upernet_vminet_{ti,xs,s,b}_512x512_160k_ade20k.py) set only the arch, the ImageNet-1K weights
# (top-level `pretrained`: an mmppma classification checkpoint, or a release one converted with
# tools/model_converters/release_to_mmppma.py --family VMINet) and the heads' in_channels. A converted release
# checkpoint also needs its revision's backbone options, as configs/vminet_*_release-<revision>_in1k.py set them:
# 6b11d4a context_mask='none', proj_norm=True; 7c2632c context_mask='tril', proj_norm=False (loading it
# with other options is an error naming them). To train from scratch: --cfg-options
# model.backbone.init_cfg=None.
_base_ = './seg_upernet_160k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmppma.VMINet',
        arch='xs',
        out_indices=(0, 1, 2, 3),
        out_norm='LN',
        norm_eval=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', prefix='backbone.')))

optim_wrapper = dict(optimizer=dict(weight_decay=0.01))
