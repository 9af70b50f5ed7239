# Mask R-CNN 1x on COCO with a PPMA-family backbone: the release's detection recipe (docs/method.md §9), the one
# place for its numbers. Everything else is mmdet's own R50-FPN 1x config (FPN, RPN/RoI heads, 1333x800
# single-scale training with flip, warmup 500 iters, steps at epochs 8 and 11, CocoMetric bbox + segm).
# Per-arch configs (configs/mask_rcnn_{ppma,rmt}_{t,s,b}_{1x,3x}_coco.py) set only the backbone type (RMT)
# and arch, drop_path_rate, the ImageNet-1K weights (top-level `pretrained`: an mmppma classification
# checkpoint or a release one, converted on load) and the FPN's in_channels.
# To train from scratch: --cfg-options model.backbone.init_cfg=None.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', './dense_optim.py']

model = dict(
    backbone=dict(
        _delete_=True,  # drop ResNet's keys
        type='mmppma.PPMA',
        arch='tiny',
        out_indices=(0, 1, 2, 3),
        out_norm=True,  # per-stage LayerNorm, as the release's dense-prediction backbones
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', prefix='backbone.')),  # per-arch configs set the checkpoint
    neck=dict(in_channels=[64, 128, 256, 512]))

# 12 epochs (inherited), batch 16 = 8 GPUs x 2 images (inherited batch_size=2).
# AdamW 1e-4, wd 0.05 (./dense_optim.py).
optim_wrapper = dict(_delete_=True, type='AmpOptimWrapper', constructor='mmppma.ParamwiseOptimWrapperConstructor',
                     optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
                     paramwise_cfg={{_base_.no_decay_paramwise_cfg}})

# lr is for 16 images per step; `--cfg-options auto_scale_lr.enable=True` rescales it to other batch sizes.
auto_scale_lr = dict(enable=False, base_batch_size=16)

# compile=dict(mode='reduce-overhead') (CUDA graphs) gains little here: the images vary in size and the proposals in
# number, so most steps bring a new shape, which compiles and records its own graphs (README "torch.compile").
