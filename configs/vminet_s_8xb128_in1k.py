# VMINet-S on ImageNet-1K; the release's recipe in ./_base_/vminet_in1k_recipe.py.
_base_ = ['./_base_/vminet_in1k_recipe.py']

model = dict(backbone=dict(arch='s'), head=dict(in_channels=384))
