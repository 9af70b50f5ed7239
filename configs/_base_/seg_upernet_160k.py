# UPerNet on ADE20K, 512x512 crops, 160k iterations, with a PPMA-family backbone: the release's
# segmentation recipe (docs/method.md §9), the one place for its numbers. Everything else is mmseg's own
# UPerNet R50 160k config (UPerHead + auxiliary FCNHead on stage 3, SyncBN in the heads, ADE20K pipeline
# with 0.5-2.0 random resize, crop 512, flip, photometric distortion; mIoU). Per-arch configs
# (configs/upernet_{ppma,rmt}_{t,s,b}_512x512_160k_ade20k.py) set only the backbone type (RMT) and arch,
# drop_path_rate, the ImageNet-1K weights (top-level `pretrained`: an mmppma classification checkpoint or a
# release one, converted on load) and the heads' in_channels. To train
# from scratch: --cfg-options model.backbone.init_cfg=None.
_base_ = ['mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py', './dense_optim.py']

model = dict(
    pretrained=None,  # the base's ResNet weights (open-mmlab://) do not fit; PPMA weights come through init_cfg
    backbone=dict(
        _delete_=True,  # drop ResNet's keys
        type='mmppma.PPMA',
        arch='tiny',
        out_indices=(0, 1, 2, 3),
        out_norm=True,  # per-stage LayerNorm, as the release's dense-prediction backbones
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', prefix='backbone.')),  # per-arch configs set the checkpoint
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))

# batch 16 = 8 GPUs x 2 images
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader

# AdamW 6e-5, wd 0.05 (./dense_optim.py).
optim_wrapper = dict(_delete_=True, type='AmpOptimWrapper', constructor='mmppma.ParamwiseOptimWrapperConstructor',
                     optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.05),
                     paramwise_cfg={{_base_.no_decay_paramwise_cfg}})

# 1500 iterations of linear warmup from 1e-6 x lr, then poly (power 1) to 0 at 160k (as the release / RMT).
max_iters = 160000
warmup_iters = 1500
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters)

# lr is for 16 images per step; `--cfg-options auto_scale_lr.enable=True` rescales it to other batch sizes.
auto_scale_lr = dict(enable=False, base_batch_size=16)

# compile=dict(mode='reduce-overhead') (CUDA graphs) records one graph for the fixed 512 x 512 training crops, but
# mmengine compiles only train_step: evaluation, on whole images of varying size, runs eager. Each new shape would
# compile and record its own graphs (README "torch.compile").
