# MLLA-S on ImageNet-1K, the release's recipe (./_base_/mlla_in1k_recipe.py); drop path from cfgs/mlla_s.yaml.
_base_ = ['./_base_/mlla_in1k_recipe.py']

model = dict(backbone=dict(arch='small', drop_path_rate=0.3), head=dict(in_channels=512))
