# UPerNet on ADE20K with MLLA-T whose linear attention is masked by the polyline path mask (PPMLA, O(N);
# mask='polyline'), otherwise the MLLA-T recipe (./upernet_mlla_t_512x512_160k_ade20k.py). The learned decays'
# A_log / dt_bias get no weight decay (the segmentation base's custom_keys).
_base_ = './upernet_mlla_t_512x512_160k_ade20k.py'

# ImageNet-1K weights of a PPMLA-T classifier (configs/ppmla_t_8xb128_in1k.py)
pretrained = 'checkpoints/ppmla_t_in1k.pth'

model = dict(backbone=dict(mask='polyline', init_cfg=dict(checkpoint=pretrained)))
