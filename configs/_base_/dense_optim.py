# The optimizer settings the detection and segmentation bases share (./det_mask_rcnn_1x.py,
# ./seg_upernet_160k.py), as the release trains both: AdamW with mixed precision, no weight decay on normalization
# layers (norm_decay_mult) nor on the learned decay parameters A_log / dt_bias (custom_keys), through mmengine's
# default constructor with plain-dict param groups, which compile=True can trace. On CPU use
# --cfg-options optim_wrapper.type=OptimWrapper (AMP needs CUDA).
no_decay_paramwise_cfg = dict(norm_decay_mult=0.0, custom_keys={'.A_log': dict(decay_mult=0.0),
                                                                '.dt_bias': dict(decay_mult=0.0)})
