# Mask R-CNN 1x on COCO with MLLA-T whose linear attention is masked by the polyline path mask (PPMLA,
# O(N); mask='polyline'), otherwise the MLLA-T recipe (./mask_rcnn_mlla_t_1x_coco.py). The learned decays'
# A_log / dt_bias get no weight decay (the detection base's custom_keys).
_base_ = './mask_rcnn_mlla_t_1x_coco.py'

# ImageNet-1K weights of a PPMLA-T classifier (configs/ppmla_t_8xb128_in1k.py)
pretrained = 'checkpoints/ppmla_t_in1k.pth'

model = dict(backbone=dict(mask='polyline', init_cfg=dict(checkpoint=pretrained)))
