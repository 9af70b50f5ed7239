"""PPMAClsHead: the release head's structure, and mmpretrain ClsHead behaviour (loss, accuracy, predict)."""
import pytest
import torch
import torch.nn as nn

from mmppma.models import PPMAClsHead


def test_matches_written_out_release_head():
    """Linear per position, BN, Swish, pool, Linear (docs/method.md §7) on the last features; the release's keys."""
    head = PPMAClsHead(7, in_channels=12, hidden_channels=20, loss=nn.Identity()).eval()
    assert [k for k in head.state_dict() if not k.startswith('norm.')] == [
        'proj.weight', 'proj.bias', 'fc.weight', 'fc.bias']
    assert isinstance(head.norm, nn.BatchNorm2d) and head.norm.num_features == 20
    head.norm.running_mean.normal_()
    head.norm.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 12, 3, 5)
    h = torch.einsum('bchw,oc->bohw', x, head.proj.weight) + head.proj.bias[:, None, None]
    h = (h - head.norm.running_mean[:, None, None]) / torch.sqrt(head.norm.running_var[:, None, None] + 1e-5)
    h = h * head.norm.weight[:, None, None] + head.norm.bias[:, None, None]
    h = h * torch.sigmoid(h)
    assert head.pre_logits((torch.randn(2, 16, 8, 8), x)).shape == (2, 20)
    torch.testing.assert_close(head((torch.randn(2, 16, 8, 8), x)), h.mean((2, 3)) @ head.fc.weight.T + head.fc.bias,
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match='in_channels'):
        head((torch.randn(1, 32, 2, 2), ))
    with pytest.raises(ValueError, match='num_classes'):
        PPMAClsHead(0, loss=nn.Identity())


def test_loss_hard_and_soft_labels(mmpretrain_ready):
    """Hard labels: cross entropy with top-k accuracies; mixup-style soft targets: label smoothing, no accuracy."""
    from mmpretrain.structures import DataSample
    head = PPMAClsHead(4, in_channels=8, loss=dict(type='CrossEntropyLoss'), topk=(1, 2), cal_acc=True)
    feats = (torch.randn(3, 8, 2, 2), )
    losses = head.loss(feats, [DataSample().set_gt_label(i) for i in (0, 3, 1)])
    torch.testing.assert_close(losses['loss'], nn.functional.cross_entropy(head(feats), torch.tensor([0, 3, 1])))
    assert set(losses) == {'loss', 'accuracy_top-1', 'accuracy_top-2'}
    head = PPMAClsHead(4, in_channels=8, loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
                       cal_acc=True)
    feats = (torch.randn(2, 8, 3, 3), )
    scores = torch.tensor([[0.7, 0.3, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6]])
    losses = head.loss(feats, [DataSample().set_gt_score(s) for s in scores])
    assert set(losses) == {'loss'}
    smoothed = scores * 0.9 + 0.1 / 4
    torch.testing.assert_close(losses['loss'], -(smoothed * head(feats).log_softmax(1)).sum(1).mean())


def test_loss_builds_from_mmpretrain_under_another_default_scope(mmpretrain_ready):
    """Under an mmseg or mmdet run's default scope the head's loss config still names mmpretrain's losses."""
    pytest.importorskip('mmseg')
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmseg'):
        head = PPMAClsHead(4, in_channels=8, loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1))
    assert type(head.loss_module).__name__ == 'LabelSmoothLoss'


def test_predict(mmpretrain_ready):
    from mmpretrain.structures import DataSample
    head = PPMAClsHead(6, in_channels=8).eval()
    feats = (torch.randn(2, 8, 2, 2), )
    out = head.predict(feats)
    probs = head(feats).softmax(1)
    assert len(out) == 2 and isinstance(out[0], DataSample)
    torch.testing.assert_close(out[1].pred_score, probs[1])
    assert out[1].pred_label.item() == probs[1].argmax().item()
    given = [DataSample().set_gt_label(1), DataSample().set_gt_label(2)]
    assert head.predict(feats, given)[0] is given[0]
