# RMT baseline in PPMA's macro architecture (fixed Manhattan decays), same recipe.
_base_ = ['./_base_/ppma_in1k_recipe.py']

model = dict(backbone=dict(type='mmppma.RMT', arch='tiny', drop_path_rate=0.1))
