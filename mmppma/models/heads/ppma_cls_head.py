"""The classification head of the PPMA/RMT releases, usable by mmpretrain's ``ImageClassifier``.

Built on mmengine's BaseModule, not on mmpretrain's ClsHead, so that importing mmppma never imports
mmpretrain; mmpretrain is imported inside the methods that need it (loss building, accuracy, DataSample).
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from mmppma.registry import register_model


def _mmpretrain(what: str):
    try:
        import mmpretrain  # noqa: F401
    except ImportError as e:
        raise ImportError(f'PPMAClsHead needs mmpretrain for {what}: pip install "mmpretrain>=1.0" '
                          f'(or pip install "mmppma[cls]")') from e


@register_model
class PPMAClsHead(BaseModule):
    """Linear(C -> 1024) per position, BatchNorm(1024), Swish, global average pool, Linear(1024 -> classes).

    Parameter names ``proj``, ``norm``, ``fc`` (release: ``proj``, ``norm``, ``head``). Behaves like
    mmpretrain's ClsHead: ``loss(feats, data_samples)`` with a configurable loss (label smoothing, soft
    mixup/cutmix targets), optional top-k accuracy for hard labels, and ``predict`` returning DataSamples
    with ``pred_score`` / ``pred_label``.

    Args:
        num_classes: classes.
        in_channels: channels of the last backbone stage C.
        hidden_channels: width of the projection (1024 in the release).
        loss: an mmpretrain loss config (built with mmpretrain's registry) or an nn.Module.
        topk: k's of the training accuracy (when ``cal_acc``).
        cal_acc: report top-k accuracy in ``loss`` for hard labels (skipped for mixup/cutmix soft targets).
        init_cfg: mmengine init config. Without one: Linear trunc_normal(.02) / bias 0, as the release.

    Input ``feats``: tuple of backbone outputs; the last is used, (B, C, H, W). Logits: (B, num_classes).
    """

    def __init__(self,
                 num_classes: int,
                 in_channels: int = 512,
                 hidden_channels: int = 1024,
                 loss: Union[dict, nn.Module] = dict(type='CrossEntropyLoss', loss_weight=1.0),
                 topk: Union[int, Tuple[int, ...]] = (1, ),
                 cal_acc: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f'num_classes must be a positive int; got {num_classes!r}')
        self.num_classes, self.in_channels, self.hidden_channels = num_classes, in_channels, hidden_channels
        self.topk = (topk, ) if isinstance(topk, int) else tuple(topk)
        self.cal_acc = cal_acc
        self.proj = nn.Linear(in_channels, hidden_channels)
        self.norm = nn.BatchNorm2d(hidden_channels)
        self.act = nn.SiLU()  # Swish
        self.fc = nn.Linear(hidden_channels, num_classes)
        if not isinstance(loss, nn.Module):
            _mmpretrain('its loss (or pass an nn.Module as loss)')
            from mmengine.registry import DefaultScope
            from mmpretrain.registry import MODELS

            # mmpretrain's losses, whichever library's scope is the default (the head also serves mmseg/mmdet runs)
            with DefaultScope.overwrite_default_scope('mmpretrain'):
                loss = MODELS.build(loss)
        self.loss_module = loss
        for m in (self.proj, self.fc):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def pre_logits(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        """feats[-1]: (B, C, H, W) -> pooled features (B, hidden_channels)."""
        x = feats[-1]
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'PPMAClsHead expects the last backbone output as (B, {self.in_channels}, H, W); got '
                             f'{tuple(x.shape)}. Set head in_channels to the backbone\'s last embed_dims and keep '
                             f'the backbone\'s out_indices ending at its last stage.')
        return self.project(x).mean(dim=(2, 3))

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> Swish(BatchNorm(Linear per position)): (B, hidden_channels, H, W), before the pool."""
        x = self.proj(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.act(self.norm(x))

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        """feats -> logits (B, num_classes)."""
        return self.fc(self.pre_logits(feats))

    def loss(self, feats: Sequence[torch.Tensor], data_samples: list, **kwargs) -> dict:
        """Loss (and top-k accuracy for hard labels when ``cal_acc``) from mmpretrain DataSamples."""
        cls_score = self(feats)
        if 'gt_score' in data_samples[0]:  # mixup / cutmix turn labels into soft scores
            target = torch.stack([s.gt_score for s in data_samples])
        else:
            target = torch.cat([s.gt_label for s in data_samples])
        losses = dict(loss=self.loss_module(cls_score, target, avg_factor=cls_score.size(0), **kwargs))
        if self.cal_acc and target.dim() == 1:
            _mmpretrain('accuracy')
            from mmpretrain.evaluation.metrics import Accuracy
            acc = Accuracy.calculate(cls_score, target, topk=self.topk)
            losses.update({f'accuracy_top-{k}': a for k, a in zip(self.topk, acc)})
        return losses

    def predict(self, feats: Sequence[torch.Tensor], data_samples: Optional[List] = None) -> list:
        """Softmax scores and argmax labels set on (new or given) mmpretrain DataSamples."""
        _mmpretrain('DataSample')
        from mmpretrain.structures import DataSample
        scores = F.softmax(self(feats), dim=1)
        labels = scores.argmax(dim=1, keepdim=True).detach()
        if data_samples is None:
            data_samples = [None] * scores.size(0)
        out = []
        for sample, score, label in zip(data_samples, scores, labels):
            sample = DataSample() if sample is None else sample
            sample.set_pred_score(score).set_pred_label(label)
            out.append(sample)
        return out
