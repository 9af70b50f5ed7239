_base_ = ['./_base_/ppma_in1k_recipe.py']

model = dict(backbone=dict(type='mmppma.PPMA', arch='base', drop_path_rate=0.4))
