# MLLA-B on ImageNet-1K, the release's recipe (./_base_/mlla_in1k_recipe.py); drop path from cfgs/mlla_b.yaml.
_base_ = ['./_base_/mlla_in1k_recipe.py']

model = dict(backbone=dict(arch='base', drop_path_rate=0.5), head=dict(in_channels=768))
