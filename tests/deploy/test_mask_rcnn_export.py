"""The whole Mask R-CNN in ONNX (mmppma/deploy/mask_rcnn.py, tools/deployment/pytorch2onnx.py): the NMS op and
RoIAlign as exported against mmcv's, and the tiny COCO config (the shipped PPMA-T config in the full tier) with
seeded weights, exported by the tool and run in onnxruntime, against mmdet's ``model.predict``, RPN head and box
head."""
import importlib.util

import pytest
import torch
import torch.nn.functional as F
import torchvision

from mmppma import deploy

from ..conftest import REPO_ROOT, load_tool

pytestmark = [pytest.mark.skipif(importlib.util.find_spec('mmdet') is None, reason='needs mmdet'),
              pytest.mark.skipif(importlib.util.find_spec('onnxruntime') is None,
                                 reason='the deploy extra: pip install -e .[deploy]')]

TOLERANCE, BOX_TOLERANCE, MASK_IOU, MASK_PROB_TOLERANCE = 1e-4, 1e-3, 0.99, 1e-3


def run_onnx(path, x):
    import onnxruntime
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    names = [o.name for o in session.get_outputs()]
    return {n: torch.from_numpy(v) for n, v in zip(names, session.run(None, {'input': x.numpy()}))}


def relative(got, want):
    return float((got - want).abs().max() / want.abs().max())


def nearest(got, want):
    """For each box of ``want``, the index of the nearest box of ``got`` (largest coordinate difference) not
    taken by an earlier one (the same box can come twice, e.g. a proposal of the whole image from two
    levels)."""
    distance = (want[:, None, :] - got[None, :, :]).abs().amax(-1)
    taken = torch.zeros(len(got), dtype=torch.bool)
    picked = []
    for row in distance:
        pick = int(torch.where(taken, float('inf'), row).argmin())
        taken[pick] = True
        picked.append(pick)
    return torch.tensor(picked, dtype=torch.int64)


def mask_iou(a, b):
    union = (a | b).flatten(1).sum(1)
    return torch.where(union > 0, (a & b).flatten(1).sum(1) / union.clamp_min(1), torch.ones(len(a)))


def random_boxes(n, size, gen):
    xy = torch.rand(n, 2, generator=gen) * size
    wh = torch.rand(n, 2, generator=gen) * size / 2
    return torch.cat([xy - wh / 4, xy + wh], dim=1)  # some reach past the image


class Nms(torch.nn.Module):

    def forward(self, boxes, scores):
        from mmppma.deploy.mask_rcnn import nms_padded
        return nms_padded(boxes, scores, 0.5, 0.3, 40)


def test_nms_exports_as_onnx_nonmaxsuppression(tmp_path):
    """The NMS op in onnxruntime keeps, per image, mmcv's boxes (``mmcv.ops.nms``, as mmdet runs it:
    candidates above the score threshold, by score), in its order, padded with -1; one file for any batch and
    number of boxes, images keeping more than 40, fewer, and none."""
    import onnx
    import onnxruntime
    from mmcv.ops import nms

    from mmppma.deploy.mask_rcnn import TRANSLATIONS
    gen = torch.Generator().manual_seed(0)
    boxes, scores = random_boxes(400, 64.0, gen).reshape(2, 200, 4), torch.rand(2, 200, generator=gen)
    path = str(tmp_path / 'nms.onnx')
    dims = {0: torch.export.Dim('batch', min=2), 1: torch.export.Dim('count', min=2)}
    torch.onnx.export(Nms(), (boxes, scores), path, dynamo=True, opset_version=18, input_names=['boxes', 'scores'],
                      dynamic_shapes=(dims, dims), custom_translation_table=TRANSLATIONS)
    assert 'NonMaxSuppression' in {node.op_type for node in onnx.load(path).graph.node}
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    for b, n in ((3, 200), (2, 30), (1, 3), (4, 25)):
        boxes, scores = random_boxes(b * n, 64.0, gen).reshape(b, n, 4), torch.rand(b, n, generator=gen)
        scores[-1] *= 0.3  # the last image: nothing above the threshold
        [got] = session.run(None, {'boxes': boxes.numpy(), 'scores': scores.numpy()})
        want = torch.full((b, 40), -1, dtype=torch.int64)
        for i in range(b):
            _, keep = nms(boxes[i], scores[i], 0.5, score_threshold=0.3)
            want[i, :min(40, len(keep))] = keep[:40]
        assert torch.equal(torch.from_numpy(got), want), (b, n)


class OffsetNms(torch.nn.Module):

    def forward(self, boxes, scores, groups, valid):
        from mmppma.deploy.mask_rcnn import _offset_nms
        return _offset_nms(boxes[None], scores[None], groups[None], valid[None], 0.5, 60)[0]


def test_nms_breaks_ties_by_index(tmp_path):
    """With most scores equal, the exported per-group NMS keeps what mmcv's ``batched_nms`` keeps when the order
    among equal scores is the index's (a stable sort), in that order: the order onnxruntime's ``TopK`` gives."""
    import onnxruntime
    from mmcv.ops import batched_nms

    from mmppma.deploy.mask_rcnn import TRANSLATIONS
    gen = torch.Generator().manual_seed(0)
    boxes = random_boxes(300, 64.0, gen)
    scores = torch.where(torch.rand(300, generator=gen) < 0.8, 1.0, torch.rand(300, generator=gen))
    groups, valid = torch.randint(0, 3, (300, ), generator=gen), torch.rand(300, generator=gen) < 0.9
    path = str(tmp_path / 'offset_nms.onnx')
    torch.onnx.export(OffsetNms(), (boxes, scores, groups, valid), path, dynamo=True, opset_version=18,
                      input_names=['boxes', 'scores', 'groups', 'valid'], custom_translation_table=TRANSLATIONS)
    [got] = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider']).run(
        None, {'boxes': boxes.numpy(), 'scores': scores.numpy(), 'groups': groups.numpy(), 'valid': valid.numpy()})
    index = valid.nonzero().squeeze(1)
    order = scores[index].sort(descending=True, stable=True)[1]
    ranks = torch.empty(len(index))
    ranks[order] = torch.arange(len(index), 0, -1, dtype=torch.float32)  # distinct, in the stable order
    _, keep = batched_nms(boxes[index], ranks, groups[index], dict(iou_threshold=0.5))
    want = torch.full((60, ), -1, dtype=torch.int64)
    want[:min(60, len(keep))] = index[keep[:60]]
    assert int((scores[want[want >= 0]] == 1).sum()) > 30  # ties decide most of what is kept
    assert torch.equal(torch.from_numpy(got), want)


def test_tie_broken_proposals_are_mmdets_without_ties():
    """The check's RPN post-processing with ties broken by index is mmdet's (``predict_by_feat``) on objectness
    without ties (the tiny config's RPN deltas, distinct logits), and puts the lower index first among equal
    scores."""
    from mmppma.deploy.mask_rcnn import data_samples, tie_broken_proposals
    torch.manual_seed(0)
    model = deploy.build_model(str(REPO_ROOT / 'configs' / 'tiny' / 'mask_rcnn_ppma_t_tiny_coco.py'))
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        cls_maps, delta_maps = model.rpn_head(model.extract_feat(x))
    # objectness logits distinct by construction (3072 of them, 1/300 apart in [-5.12, 5.12]: distinct sigmoids)
    sizes = [m.numel() for m in cls_maps]
    logits = (torch.randperm(sum(sizes), generator=torch.Generator().manual_seed(0)) - sum(sizes) / 2) / 300
    cls_maps = [part.reshape(m.shape) for part, m in zip(logits.split(sizes), cls_maps)]
    meta = data_samples(1, 96, 128)[0].metainfo
    want = model.rpn_head.predict_by_feat(cls_maps, delta_maps, batch_img_metas=[meta], rescale=False)[0]
    scores = torch.cat([m[0].permute(1, 2, 0).reshape(-1) for m in cls_maps]).sigmoid()
    deltas = torch.cat([m[0].permute(1, 2, 0).reshape(-1, 4) for m in delta_maps])
    assert len(scores.unique()) == len(scores)
    sizes = [m.shape[-2:] for m in cls_maps]
    got = tie_broken_proposals(model, scores, deltas, sizes, 96, 128)
    assert torch.equal(got.bboxes, want.bboxes) and torch.equal(got.scores, want.scores)
    tied = tie_broken_proposals(model, torch.ones_like(scores), deltas, sizes, 96, 128)
    anchors = torch.cat(model.rpn_head.prior_generator.grid_priors(sizes, device='cpu'))
    boxes = model.rpn_head.bbox_coder.decode(anchors, deltas, max_shape=(96, 128))
    nonempty = ((boxes[:, 2:] - boxes[:, :2]) > 0).all(1)
    assert torch.equal(tied.bboxes[0], boxes[nonempty][0])  # the first anchor whose box is not empty


class RoIAlignLevel(torch.nn.Module):

    def forward(self, feat, rois):
        return torchvision.ops.roi_align(feat, rois, (7, 7), 0.25, 0, aligned=True)


def test_roi_align_exports_as_mmcv_roi_align(tmp_path):
    """torchvision's RoIAlign as exported (ONNX RoiAlign, ``half_pixel``, adaptive sampling) computes mmcv's
    ``RoIAlign(aligned=True, sampling_ratio=0)`` (mmdet's RoI layers), for boxes smaller than a bin, larger
    than the map, and partly outside it, on two images."""
    import onnxruntime
    from mmcv.ops import roi_align
    gen = torch.Generator().manual_seed(0)
    feat = torch.randn(2, 8, 16, 20, generator=gen)
    boxes = torch.cat([random_boxes(30, 80.0, gen), torch.tensor([[3., 4., 5., 5.], [-20., -8., 100., 90.]])])
    rois = torch.cat([torch.randint(0, 2, (32, 1), generator=gen).float(), boxes], dim=1)
    path = str(tmp_path / 'roi_align.onnx')
    torch.onnx.export(RoIAlignLevel(), (feat, rois), path, dynamo=True, opset_version=18,
                      input_names=['feat', 'rois'])
    [got] = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider']).run(
        None, {'feat': feat.numpy(), 'rois': rois.numpy()})
    want = roi_align(feat, rois, (7, 7), 0.25, 0, 'avg', True)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=0, atol=1e-5)


class RoIFeatures(torch.nn.Module):

    def __init__(self, extractor):
        super().__init__()
        self.extractor = extractor

    def forward(self, f0, f1, f2, f3, rois):
        from mmppma.deploy.mask_rcnn import MaskRCNNExport
        return MaskRCNNExport._roi_features(self.extractor, [f0, f1, f2, f3], rois)


def test_roi_features_once_per_roi_at_its_level(tmp_path):
    """Each RoI pooled once at its level is mmdet's ``SingleRoIExtractor`` (mmcv's RoIAlign at the level
    ``map_roi_levels`` assigns), in torch and in onnxruntime, one file at two batches and map sizes, boxes of
    every level, at the image's border and empty, RoIs of one level only, and no RoIs at all."""
    import onnxruntime
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
    extractor = SingleRoIExtractor(dict(type='RoIAlign', output_size=7, sampling_ratio=0), out_channels=8,
                                   featmap_strides=[4, 8, 16, 32])
    gen = torch.Generator().manual_seed(0)

    def inputs(batch, height, width):
        feats = [torch.randn(batch, 8, -(-height // s), -(-width // s), generator=gen) for s in (4, 8, 16, 32)]
        xy = torch.rand(60, 2, generator=gen) * torch.tensor([width, height])
        boxes = torch.cat([xy, xy + torch.rand(60, 2, generator=gen) ** 2 * torch.tensor([width, height])], dim=1)
        boxes = torch.cat([boxes, torch.tensor([[0., 0., width, height], [width - 9., height - 3., width, height],
                                                [5., 5., 5., 9.]])])
        boxes[:, 0::2], boxes[:, 1::2] = boxes[:, 0::2].clamp(0, width), boxes[:, 1::2].clamp(0, height)
        index = torch.randint(0, batch, (len(boxes), 1), generator=gen).float()
        return (*feats, torch.cat([index, boxes], dim=1))

    x = inputs(2, 480, 640)
    levels = extractor.map_roi_levels(x[-1], 4)
    assert set(levels.tolist()) == {0, 1, 2, 3}
    path = str(tmp_path / 'roi_features.onnx')
    dims = [{0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO}] * 4
    torch.onnx.export(RoIFeatures(extractor), x, path, dynamo=True, opset_version=18,
                      dynamic_shapes=(*dims, {0: torch.export.Dim.AUTO}))
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    other = inputs(3, 512, 416)
    one_level = other[-1][extractor.map_roi_levels(other[-1], 4) == 1]
    no_rois = other[-1][:0]  # the mask head's input when nothing is detected
    for x in (x, other, (*other[:4], one_level), (*other[:4], no_rois)):
        want = extractor(list(x[:4]), x[-1])
        torch.testing.assert_close(RoIFeatures(extractor)(*x), want, rtol=0, atol=1e-5)
        [got] = session.run(None, {i.name: v.numpy() for i, v in zip(session.get_inputs(), x)})
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=0, atol=1e-5)


def test_paste_masks_is_mmdets_do_paste_mask():
    """numpy and torch paste the probabilities as mmdet's ``_do_paste_mask`` (whole image), for boxes inside,
    partly outside and larger than the image, and empty ones; with a threshold, mmdet's binary masks."""
    from mmdet.models.roi_heads.mask_heads.fcn_mask_head import _do_paste_mask

    from mmppma.deploy import paste_masks
    gen = torch.Generator().manual_seed(0)
    height, width = 37, 53
    boxes = torch.cat([random_boxes(20, 60.0, gen), torch.tensor([[-9., -4., 70., 45.], [10., 5., 10., 20.],
                                                                   [3.5, 4., 9., 4.]])])
    probs = torch.rand(len(boxes), 28, 28, generator=gen)
    want = _do_paste_mask(probs[:, None], boxes, height, width, skip_empty=False)[0]
    assert torch.equal(paste_masks(probs, boxes, height, width), want)
    got = paste_masks(probs.numpy(), boxes.numpy(), height, width)
    assert got.dtype == 'float32' and got.shape == (len(boxes), height, width)
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=0, atol=1e-5)
    binary = paste_masks(probs.numpy(), boxes.numpy(), height, width, threshold=0.5)
    near = (want - 0.5).abs() <= 1e-5
    assert torch.equal(torch.from_numpy(binary)[~near], (want >= 0.5)[~near])
    with pytest.raises(ValueError, match=r'mask_probs must be \(N, M, M\)'):
        paste_masks(probs[:, :5], boxes, height, width)
    with pytest.raises(TypeError, match='must both be numpy arrays or both torch tensors'):
        paste_masks(probs.numpy(), boxes, height, width)


def assert_masks_match(model, feats, want, got_masks, height, width):
    """Each mask's IoU with mmdet's is at least 0.99, or the pixels that differ are ones where mmdet's
    pasted probability is within 1e-3 of the threshold (a box that differs by 1e-6 moves such a pixel across)."""
    from mmdet.models.roi_heads.mask_heads.fcn_mask_head import _do_paste_mask
    from mmdet.structures.bbox import bbox2roi
    low = (mask_iou(got_masks, want.masks) < MASK_IOU).nonzero().squeeze(1)
    if len(low):
        with torch.no_grad():
            logits = model.roi_head._mask_forward(feats, bbox2roi([want.bboxes[low]]))['mask_preds']
        probs = logits.sigmoid()[torch.arange(len(low)), want.labels[low]][:, None]
        pasted = _do_paste_mask(probs, want.bboxes[low], height, width, skip_empty=False)[0]
        differ = got_masks[low] != want.masks[low]
        margin = (pasted - model.roi_head.test_cfg.mask_thr_binary).abs()
        assert (margin[differ] <= MASK_PROB_TOLERANCE).all(), margin[differ].max()


def seeded_model(tool, config, path, batch, height, width, cls_std, cls_seed):
    """``(model, x)``: the tool's random weights and input (``--seed 0``: the input is drawn after the build)
    with the box head's classifier drawn again, N(0, cls_std^2) from ``cls_seed``, bias 0, so that scores
    spread over the proposals and the top ones are far apart; the weights saved to ``path``."""
    torch.manual_seed(0)
    model = deploy.build_model(str(config))
    x = torch.randn(batch, 3, height, width)
    fc = model.roi_head.bbox_head.fc_cls
    fc.weight.data = torch.randn(fc.weight.shape, generator=torch.Generator().manual_seed(cls_seed)) * cls_std
    fc.bias.data.zero_()
    torch.save({'state_dict': model.state_dict()}, path)
    return model, x


def check_against_mmdet(model, x, out, top):
    """The file in onnxruntime on ``x`` against mmdet on the same input: the RPN head's outputs,
    and the box head's on the file's proposals, within 1e-4, the proposals matching mmdet's; every detection
    of ``model.predict`` matched (label, box, score, mask: :func:`assert_masks_match`), the ``top`` ones,
    whose scores are asserted apart by more than 1e-4, in order.

    Random weights give objectness scores that differ by less than the two backends' rounding (1e-6) near
    mmdet's top-k and NMS decisions. Where mmdet's ``rpn_head.predict`` then keeps other proposals, they are
    compared, as the tool compares them, with mmdet's RPN post-processing of the file's own objectness and deltas
    (:func:`~mmppma.deploy.mask_rcnn.tie_broken_proposals`), and the detections with mmdet's RoI head on those."""
    import onnx
    from mmdet.structures import DetDataSample
    from mmdet.structures.bbox import bbox2roi

    from mmppma.deploy import paste_masks
    from mmppma.deploy.mask_rcnn import tie_broken_proposals
    graph = onnx.load(str(out)).graph
    ops = {node.op_type for node in graph.node}
    assert {'NonMaxSuppression', 'RoiAlign'} <= ops, ops
    assert {node.domain for node in graph.node} <= {'', 'ai.onnx'}  # ONNX's own ops only
    batch, _, height, width = x.shape
    got = run_onnx(out, x)
    assert ('GridSample' in ops) == ('masks' in got)  # the paste is in the graph only if asked for
    meta = dict(img_shape=(height, width), ori_shape=(height, width), scale_factor=(1.0, 1.0))
    samples = [DetDataSample(metainfo=meta) for _ in range(batch)]
    with torch.no_grad():
        results = model.predict(x, samples)
        feats = model.extract_feat(x)
        cls_maps, delta_maps = model.rpn_head(feats)
        proposals = model.rpn_head.predict(feats, samples, rescale=False)
    for b in range(batch):
        # before NMS
        rpn_scores = torch.cat([m[b].permute(1, 2, 0).reshape(-1) for m in cls_maps]).sigmoid()
        rpn_deltas = torch.cat([m[b].permute(1, 2, 0).reshape(-1, 4) for m in delta_maps])
        assert relative(got['rpn_scores'][b], rpn_scores) <= TOLERANCE
        assert relative(got['rpn_deltas'][b], rpn_deltas) <= TOLERANCE
        want = results[b].pred_instances
        boxes = proposals[b].bboxes
        assert int(got['num_proposals'][b]) == len(boxes)
        matched = nearest(got['proposals'][b, :len(boxes)], boxes)
        if len(set(matched.tolist())) < len(boxes) or relative(got['proposals'][b, matched], boxes) > BOX_TOLERANCE:
            kept = tie_broken_proposals(model, got['rpn_scores'][b], got['rpn_deltas'][b],
                                        [m.shape[-2:] for m in cls_maps], height, width)
            boxes = kept.bboxes
            assert int(got['num_proposals'][b]) == len(boxes)
            matched = nearest(got['proposals'][b, :len(boxes)], boxes)
            with torch.no_grad():
                want = model.roi_head.predict([f[b:b + 1] for f in feats], [kept], samples[b:b + 1],
                                              rescale=False)[0]
        assert len(set(matched.tolist())) == len(boxes)
        assert relative(got['proposals'][b, matched], boxes) <= BOX_TOLERANCE
        rois = bbox2roi([got['proposals'][b, :len(boxes)]])  # the box head on the file's proposals
        with torch.no_grad():
            head = model.roi_head._bbox_forward([f[b:b + 1] for f in feats], rois)
        assert relative(got['roi_scores'][b, :len(boxes)], F.softmax(head['cls_score'], -1)) <= TOLERANCE
        assert relative(got['roi_deltas'][b, :len(boxes)], head['bbox_pred']) <= TOLERANCE
        # the detections
        n = int(got['num_dets'][b])
        assert n == len(want) > top
        assert (want.scores[:top] - want.scores[1:top + 1]).min() > TOLERANCE  # the top ones are far apart
        assert torch.equal(got['labels'][b, :top], want.labels[:top])
        assert relative(got['boxes'][b, :top], want.bboxes[:top]) <= BOX_TOLERANCE
        assert (got['scores'][b, :top] - want.scores[:top]).abs().max() <= TOLERANCE
        matched = nearest(got['boxes'][b, :n], want.bboxes)  # all of them, in any order
        assert len(set(matched.tolist())) == n
        assert torch.equal(got['labels'][b, matched], want.labels)
        assert relative(got['boxes'][b, matched], want.bboxes) <= BOX_TOLERANCE
        assert (got['scores'][b, matched] - want.scores).abs().max() <= TOLERANCE
        threshold = model.roi_head.test_cfg.mask_thr_binary
        pasted = paste_masks(got['mask_probs'][b, matched].numpy(), got['boxes'][b, matched].numpy(), height,
                             width, threshold)  # numpy, as a consumer without torch pastes them
        assert_masks_match(model, [f[b:b + 1] for f in feats], want, torch.from_numpy(pasted), height, width)
        if 'masks' in got:
            assert_masks_match(model, [f[b:b + 1] for f in feats], want, got['masks'][b, matched], height, width)
            assert not got['masks'][b, n:].any()
        assert not got['mask_probs'][b, n:].any() and (got['labels'][b, n:] == -1).all()


CASES = [
    pytest.param('tiny/mask_rcnn_ppma_t_tiny_coco.py', 1, 192, 192, 0.1, 2, ['--paste-masks'], id='tiny_coco',
                 marks=pytest.mark.slow),
    pytest.param('mask_rcnn_ppma_t_1x_coco.py', 2, 320, 320, 0.1, 3, [], id='ppma_t_1x',
                 marks=[pytest.mark.heavy, pytest.mark.slow(minutes=3)]),
]


@pytest.mark.parametrize('config, batch, height, width, cls_std, cls_seed, extra', CASES)
def test_whole_mask_rcnn_matches_predict(config, batch, height, width, cls_std, cls_seed, extra, tmp_path, capsys):
    """The tool exports the whole detector with seeded weights and checks it; the file, run here in
    onnxruntime, gives mmdet's outputs before NMS and its detections (:func:`check_against_mmdet`; the tiny
    one with the masks also pasted in the graph)."""
    tool = load_tool('deployment/pytorch2onnx.py')
    config = REPO_ROOT / 'configs' / config
    checkpoint, out = tmp_path / 'seeded.pth', tmp_path / 'model.onnx'
    model, x = seeded_model(tool, config, checkpoint, batch, height, width, cls_std, cls_seed)
    argv = [str(config), str(checkpoint), '--shape', str(height), str(width), '--batch', str(batch), '--out', str(out),
            *extra]
    assert tool.main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if 'vs model.predict' in line]
    print('\n'.join(lines))  # the figures, for docs/deployment.md (pytest -rP shows them)
    assert len(lines) == batch
    check_against_mmdet(model, x, out, top=10)


@pytest.mark.heavy
@pytest.mark.slow
def test_saturated_rpn_scores(tmp_path, capsys):
    """The RPN's classifier x100: hundreds of anchors' objectness is exactly 1.0, more than ``nms_pre`` on the
    finest level, so which ones are kept is decided by the order among equal scores (and by anchors at 1 in
    one runtime and just below in the other). mmdet's RPN keeps other proposals than the file; the tool's check
    passes, against mmdet's post-processing of the file's RPN outputs with ties broken by index."""
    from mmppma.deploy.mask_rcnn import run_onnx
    tool = load_tool('deployment/pytorch2onnx.py')
    config = REPO_ROOT / 'configs' / 'tiny' / 'mask_rcnn_ppma_t_tiny_coco.py'
    checkpoint, out = tmp_path / 'saturated.pth', tmp_path / 'model.onnx'
    model, x = seeded_model(tool, config, checkpoint, 1, 192, 192, 0.1, 2)
    model.rpn_head.rpn_cls.weight.data *= 100
    torch.save({'state_dict': model.state_dict()}, checkpoint)
    with torch.no_grad():
        feats = model.extract_feat(x)
        finest = model.rpn_head(feats)[0][0].sigmoid()
        mmdet = model.rpn_head.predict(feats, tool_samples(x), rescale=False)[0]
    assert int((finest == 1).sum()) > model.rpn_head.test_cfg.nms_pre
    assert tool.main([str(config), str(checkpoint), '--shape', '192', '192', '--out', str(out)]) == 0
    assert 'equal RPN scores' in capsys.readouterr().out
    got = run_onnx(str(out), x)
    n = int(got['num_proposals'][0])
    assert n != len(mmdet) or not torch.allclose(got['proposals'][0, :n], mmdet.bboxes)  # the case that matters


@pytest.mark.heavy
@pytest.mark.slow
def test_no_detections(tmp_path):
    """A score threshold no score passes: the file detects nothing, as ``model.predict``, and runs its mask head on
    no RoI (an empty batch in onnxruntime); every row is padding."""
    from mmppma.deploy.mask_rcnn import run_onnx
    tool = load_tool('deployment/pytorch2onnx.py')
    config = REPO_ROOT / 'configs' / 'tiny' / 'mask_rcnn_ppma_t_tiny_coco.py'
    out, options = tmp_path / 'model.onnx', {'model.test_cfg.rcnn.score_thr': 1.0}
    assert tool.main([str(config), '--shape', '160', '192', '--batch', '2', '--out', str(out), '--cfg-options',
                      *(f'{k}={v}' for k, v in options.items())]) == 0
    torch.manual_seed(0)
    model = deploy.build_model(str(config), cfg_options=options)
    x = torch.randn(2, 3, 160, 192)
    with torch.no_grad():
        assert [len(r.pred_instances) for r in model.predict(x, tool_samples(x))] == [0, 0]
    got = run_onnx(str(out), x)
    assert got['num_dets'].tolist() == [0, 0] and got['mask_probs'].shape[1:] == (50, 28, 28)
    assert not got['mask_probs'].any() and (got['labels'] == -1).all() and not got['boxes'].any()


def tool_samples(x):
    from mmppma.deploy.mask_rcnn import data_samples
    return data_samples(x.shape[0], *x.shape[2:])


DYNAMIC_CASES = [
    # 8 min on the 2-core machine under load (tracing with symbolic shapes): full tier
    pytest.param('tiny/mask_rcnn_ppma_t_tiny_coco.py', 128, 128, 0.1, 2, ['--paste-masks'], id='tiny_coco',
                 marks=[pytest.mark.heavy, pytest.mark.slow(minutes=8)]),
    pytest.param('mask_rcnn_ppma_t_1x_coco.py', 800, 1344, 0.1, 3, [], id='ppma_t_1x_800x1344',
                 marks=[pytest.mark.heavy, pytest.mark.slow(minutes=15)]),
    pytest.param('mask_rcnn_ppma_t_1x_coco.py', 1344, 800, 0.1, 3, [], id='ppma_t_1x_1344x800',
                 marks=[pytest.mark.heavy, pytest.mark.slow(minutes=15)]),
]


@pytest.mark.parametrize('config, height, width, cls_std, cls_seed, extra', DYNAMIC_CASES)
def test_dynamic_mask_rcnn_two_batches_two_sizes(config, height, width, cls_std, cls_seed, extra, tmp_path, capsys):
    """One file, traced at batch 2 (``--dynamic``): the tool checks it against ``model.predict`` at batch 1 and
    2 and at another size (H 3/4, W 5/4 as large); the file, run here on another input of a third size,
    gives mmdet's outputs and detections (:func:`check_against_mmdet`)."""
    from mmppma import deploy
    tool = load_tool('deployment/pytorch2onnx.py')
    config = REPO_ROOT / 'configs' / config
    checkpoint, out = tmp_path / 'seeded.pth', tmp_path / 'model.onnx'
    model, _ = seeded_model(tool, config, checkpoint, 1, height, width, cls_std, cls_seed)
    argv = [str(config), str(checkpoint), '--shape', str(height), str(width), '--dynamic', '--out', str(out), *extra]
    assert tool.main(argv) == 0
    assert deploy.dynamic_axes(str(out)) == ['batch', 'height', 'width']
    lines = [line for line in capsys.readouterr().out.splitlines() if 'vs model.predict' in line]
    print('\n'.join(lines))  # the figures, for docs/deployment.md (pytest -rP shows them)
    h2, w2 = max(32, height * 3 // 4 // 32 * 32), -(-width * 5 // 4 // 32) * 32
    assert [line.split(' of ')[1].split(')')[0] + ')' for line in lines] == [
        f'(1, 3, {height}, {width})', f'(2, 3, {height}, {width})', f'(2, 3, {height}, {width})',
        f'(2, 3, {h2}, {w2})', f'(2, 3, {h2}, {w2})']
    batch = 3 if height < 512 else 1
    other = torch.randn(batch, 3, height + 32, width - 32, generator=torch.Generator().manual_seed(5))
    check_against_mmdet(model, other, out, top=10)


@pytest.mark.parametrize('extra, code, cause', [
    (['--cfg-options', 'model.roi_head.mask_head=None'], 3,
     'export failed: MaskRCNN: the RoI head is not a StandardRoIHead with an FCNMaskHead'),
], ids=['no_mask_head'])
def test_detector_refused(extra, code, cause, tmp_path, capsys):
    """A detector that is not Mask R-CNN's: one line and the exit code, no file."""
    tool = load_tool('deployment/pytorch2onnx.py')
    config = str(REPO_ROOT / 'configs' / 'tiny' / 'mask_rcnn_ppma_t_tiny_coco.py')
    out = tmp_path / 'model.onnx'
    assert tool.main([config, '--shape', '64', '64', '--out', str(out), *extra]) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'pytorch2onnx: {config}: {cause}'), lines
    assert not out.exists()
