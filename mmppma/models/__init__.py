"""Models: layers, backbones, heads. Importing this registers every model class (the registry's location).

Imports neither mmpretrain, mmdet nor mmseg: a user may have only one of them.
"""
from .backbones import MLLA, PPMA, RMT, VMINet
from .heads import PPMAClsHead

__all__ = ['PPMA', 'RMT', 'PPMAClsHead']
__all__ += ['MLLA']
__all__ += ['VMINet']
