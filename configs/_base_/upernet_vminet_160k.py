# UPerNet with a VMINet backbone on ADE20K, 512x512, 160k iterations; recipe in ./seg_upernet_160k.py (batch 16,
# 1500 warmup iterations, linear decay), with the paper's weight decay 0.01 and the base's lr 6e-5 (the paper's
# value is not legible in its text); the backbone in ./vminet_dense_backbone.py.
_base_ = ['./seg_upernet_160k.py', './vminet_dense_backbone.py']

model = dict(backbone={{_base_.vminet_dense_backbone}})

optim_wrapper = dict(optimizer=dict(weight_decay=0.01))
