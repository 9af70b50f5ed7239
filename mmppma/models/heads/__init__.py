"""Heads that upstream lacks, and the release classifiers' heads by name."""
from .ppma_cls_head import PPMAClsHead
from .release_heads import RELEASE_HEADS, LinearHead, release_head, set_classifier

__all__ = ['PPMAClsHead', 'LinearHead', 'RELEASE_HEADS', 'release_head', 'set_classifier']
