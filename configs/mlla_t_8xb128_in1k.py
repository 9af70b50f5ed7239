# MLLA-T on ImageNet-1K, the release's recipe (./_base_/mlla_in1k_recipe.py); drop path from cfgs/mlla_t.yaml.
_base_ = ['./_base_/mlla_in1k_recipe.py']

model = dict(backbone=dict(arch='tiny', drop_path_rate=0.2), head=dict(in_channels=512))
