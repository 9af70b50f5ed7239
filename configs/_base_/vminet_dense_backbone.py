# The VMINet backbone of the detection and segmentation configs (./mask_rcnn_vminet_1x.py,
# ./upernet_vminet_160k.py). Our choices, the release having no dense-prediction code: per-stage LayerNorm
# outputs, BatchNorm statistics frozen (2 images per GPU), drop path 0.1. Per-arch configs set only the arch, the
# ImageNet-1K weights (top-level `pretrained`: an mmppma classification checkpoint or a release one, converted on
# load) and the neck's / heads' in_channels. A release checkpoint also needs its revision's backbone options, as
# configs/vminet_*_release-<revision>_in1k.py set them: 6b11d4a context_mask='none', proj_norm=True; 7c2632c
# context_mask='tril', proj_norm=False (loading it with other options is an error naming them). To train from
# scratch: --cfg-options model.backbone.init_cfg=None.
vminet_dense_backbone = dict(
    _delete_=True,
    type='mmppma.VMINet',
    arch='xs',
    out_indices=(0, 1, 2, 3),
    out_norm='LN',
    norm_eval=True,
    drop_path_rate=0.1,
    init_cfg=dict(type='Pretrained', prefix='backbone.'))
