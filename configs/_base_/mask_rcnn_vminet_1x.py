# Mask R-CNN 1x with a VMINet backbone on COCO; recipe in ./det_mask_rcnn_1x.py (AdamW 1e-4, wd .05, 12 epochs,
# as Swin's; the paper's detection settings follow Swin), mmdet's FPN on all four stages (the paper uses a
# ViTDet-style simple pyramid from the last map); the backbone in ./vminet_dense_backbone.py.
_base_ = ['./det_mask_rcnn_1x.py', './vminet_dense_backbone.py']

model = dict(backbone={{_base_.vminet_dense_backbone}})
