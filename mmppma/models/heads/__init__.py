"""Heads that upstream lacks."""
from .ppma_cls_head import PPMAClsHead

__all__ = ['PPMAClsHead']
