"""The release classifiers' heads, by the name a family spec gives (``FamilySpec.head``): PPMA's projection head
(:class:`~.ppma_cls_head.PPMAClsHead`) or an average pool and a linear classifier (:class:`LinearHead`, the keys
of mmpretrain's ``GlobalAveragePooling`` and ``LinearClsHead``). timm's classifier is built of one, and the
converter checks a release classifier's head against one."""
from typing import Callable, Dict, Optional

import torch
import torch.nn as nn

from .ppma_cls_head import PPMAClsHead

#: PPMAClsHead's projection width in the releases
PPMA_HEAD_HIDDEN = 1024


class LinearHead(nn.Module):
    """Average pool and ``fc``: mmpretrain's ``GlobalAveragePooling`` neck and ``LinearClsHead`` (same keys)."""

    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.in_channels = self.hidden_channels = in_channels
        self.fc: nn.Module = nn.Identity()  # set_classifier sets it

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The map before the pool: ``x`` itself (PPMAClsHead's projects it)."""
        return x


#: head name -> (in_channels, hidden_channels or None) -> the head, without its classifier
RELEASE_HEADS: Dict[str, Callable[[int, Optional[int]], nn.Module]] = {
    'ppma': lambda c, hidden: PPMAClsHead(1, c, hidden or PPMA_HEAD_HIDDEN, loss=nn.Identity()),
    'linear': lambda c, hidden: LinearHead(c),
}


def set_classifier(head: nn.Module, num_classes: int) -> None:
    """A new ``head.fc`` from the head's ``hidden_channels`` to ``num_classes`` (0: none, ``nn.Identity``),
    initialized as the releases' (trunc_normal .02, bias 0)."""
    fc = nn.Linear(head.hidden_channels, num_classes) if num_classes else nn.Identity()
    if num_classes:
        nn.init.trunc_normal_(fc.weight, std=0.02)
        nn.init.zeros_(fc.bias)
    head.fc = fc
    head.num_classes = num_classes


def release_head(name: str, in_channels: int, num_classes: int, hidden_channels: Optional[int] = None) -> nn.Module:
    """The release head ``name`` (a key of :data:`RELEASE_HEADS`) on ``in_channels`` with a classifier for
    ``num_classes``; ``hidden_channels``: PPMAClsHead's projection width (default the releases' 1024)."""
    if name not in RELEASE_HEADS:
        raise ValueError(f'head={name!r}; choose one of {", ".join(RELEASE_HEADS)}')
    head = RELEASE_HEADS[name](in_channels, hidden_channels)
    set_classifier(head, num_classes)
    return head
