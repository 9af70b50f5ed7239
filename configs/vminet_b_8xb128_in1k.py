# VMINet-B on ImageNet-1K; the release's recipe in ./_base_/vminet_in1k_recipe.py.
_base_ = ['./_base_/vminet_in1k_recipe.py']

model = dict(backbone=dict(arch='b'), head=dict(in_channels=768))
