"""The whole Mask R-CNN (mmdet's two-stage detector with RPNHead and StandardRoIHead) as one ONNX graph.

:class:`MaskRCNNExport` runs backbone, neck, RPN and RoI heads and both NMS stages of ``model.predict``, batched,
in ops that ``torch.onnx.export(dynamo=True)`` translates: NMS through :func:`nms_padded` (a torch.library op
translated to ONNX NonMaxSuppression, :data:`TRANSLATIONS`), RoIAlign through ``torchvision.ops.roi_align``
(ONNX RoiAlign, ``half_pixel``), every size taken from the input's (so batch, height and width can be dynamic),
data-dependent counts as outputs padded to a fixed size (:func:`output_names`); masks at RoI resolution, pasted
by :func:`mmppma.deploy.masks.paste_masks` (or in the graph, on request). :func:`compare_with_predict` checks a
file in onnxruntime against ``model.predict``. docs/deployment.md.
"""
from typing import Dict, List, NamedTuple, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision  # imported before an export traces its ops, or the exporter does not translate them
from torch import Tensor

from .masks import paste_masks
from .runtime import (
    DetectionMismatch,
    OnnxRuntimeFailure,
    UnsupportedDetector,
    first_line,
    onnx_session,
    relative_difference,
)

#: the outputs of the exported graph, in order (B images, K = test_cfg.rcnn.max_per_img detections, M the
#: mask head's size, A anchors, P = test_cfg.rpn.max_per_img proposals, C classes); rows past a count are
#: padding. With ``paste_masks`` the file has ``masks`` after ``mask_probs`` (:func:`output_names`).
OUTPUT_NAMES = ('num_dets', 'boxes', 'scores', 'labels', 'mask_probs',
                'rpn_scores', 'rpn_deltas', 'num_proposals', 'proposals', 'roi_scores', 'roi_deltas')
OUTPUT_SHAPES = {
    'num_dets': '(B,) int64: detections per image',
    'boxes': '(B, K, 4) float32: x1, y1, x2, y2 in input pixels, by score; padding 0',
    'scores': '(B, K) float32; padding 0',
    'labels': '(B, K) int64: class index; padding -1',
    'mask_probs': "(B, K, M, M) float32: the mask head's probabilities (sigmoid) of the detection's class on "
                  'an M x M grid over its box, for mmppma.deploy.paste_masks; padding 0',
    'masks': '(B, K, H, W) bool: the masks pasted at the input size and thresholded (paste_masks only); '
             'padding False',
    'rpn_scores': '(B, A) float32: RPN objectness (sigmoid) of every anchor, before top-k and NMS',
    'rpn_deltas': '(B, A, 4) float32: RPN box deltas of every anchor',
    'num_proposals': '(B,) int64: proposals after the RPN NMS',
    'proposals': '(B, P, 4) float32: the proposals, by score; padding 0',
    'roi_scores': '(B, P, C + 1) float32: class scores (softmax, background last) of each proposal, before NMS',
    'roi_deltas': '(B, P, 4C) float32: box deltas of each proposal',
}


def output_names(paste: bool = False) -> Tuple[str, ...]:
    """The file's outputs in order: :data:`OUTPUT_NAMES`, with ``masks`` after ``mask_probs`` if ``paste``."""
    if not paste:
        return OUTPUT_NAMES
    at = OUTPUT_NAMES.index('mask_probs') + 1
    return OUTPUT_NAMES[:at] + ('masks', ) + OUTPUT_NAMES[at:]


#: the boxes' scale factor in the bounds of :func:`compare_with_predict` (relative to the input size)
BOX_TOLERANCE = 1e-3
MASK_IOU = 0.99
#: a mask pixel may differ from mmdet's where mmdet's pasted probability is this close to the threshold
MASK_PROB_TOLERANCE = 1e-3


@torch.library.custom_op('mmppma::nms_padded', mutates_args=())
def nms_padded(boxes: Tensor, scores: Tensor, iou_threshold: float, score_threshold: float,
               max_output: int) -> Tensor:
    """Greedy NMS per image of ``boxes`` (B, N, 4: x1, y1, x2, y2) over the candidates with
    ``scores > score_threshold`` (B, N), by descending score: per image, the indices of the first
    ``max_output`` kept, padded with -1 to ``max_output`` (B, max_output). A box suppresses the later ones
    whose IoU with it exceeds ``iou_threshold``. Exports as ONNX NonMaxSuppression (:data:`TRANSLATIONS`)."""
    out = torch.full((boxes.shape[0], max_output), -1, dtype=torch.int64, device=boxes.device)
    for image, (image_boxes, image_scores) in enumerate(zip(boxes, scores)):
        candidates = torch.nonzero(image_scores > score_threshold).squeeze(1)
        keep = torchvision.ops.nms(image_boxes[candidates], image_scores[candidates], iou_threshold)[:max_output]
        out[image, :keep.numel()] = candidates[keep]
    return out


@nms_padded.register_fake
def _nms_padded_fake(boxes, scores, iou_threshold, score_threshold, max_output):
    return boxes.new_empty((boxes.shape[0], max_output), dtype=torch.int64)


def _nms_padded_onnx(boxes, scores, iou_threshold: float, score_threshold: float, max_output: int):
    """NonMaxSuppression over the batch (one class), its (image, class, box) rows, which come by image and
    by score within one, scattered into (B, max_output) at their rank within their image."""
    from onnxscript import opset18 as op
    selected = op.NonMaxSuppression(
        boxes, op.Unsqueeze(scores, [1]), op.Constant(value_ints=[max_output]),
        op.Constant(value_floats=[iou_threshold]), op.Constant(value_floats=[score_threshold]))
    image = op.Reshape(op.Slice(selected, [0], [1], [1]), [-1])
    index = op.Reshape(op.Slice(selected, [2], [3], [1]), [-1])
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    batch = op.Shape(boxes, start=0, end=1)
    images = op.Range(zero, op.Squeeze(batch, [0]), one)
    counts = op.ReduceSum(op.Cast(op.Equal(op.Unsqueeze(image, [1]), images), to=7), [0], keepdims=0)
    starts = op.Sub(op.CumSum(counts, zero), counts)  # the first row of each image
    rows = op.Squeeze(op.Shape(selected, start=0, end=1), [0])
    rank = op.Sub(op.Range(zero, rows, one), op.Gather(starts, image, axis=0))
    padded = op.Expand(op.Constant(value_ints=[-1]), op.Concat(batch, op.Constant(value_ints=[max_output]), axis=0))
    return op.ScatterND(padded, op.Concat(op.Unsqueeze(image, [1]), op.Unsqueeze(rank, [1]), axis=1), index)


#: the ONNX translations of this module's ops (``torch.onnx.export(custom_translation_table=...)``)
TRANSLATIONS = {torch.ops.mmppma.nms_padded.default: _nms_padded_onnx}


def _offset_nms(boxes: Tensor, scores: Tensor, groups: Tensor, valid: Tensor, iou_threshold: float,
                max_output: int) -> Tensor:
    """mmcv's ``batched_nms`` per image over the ``valid`` candidates (``boxes`` (B, N, 4), ``scores``,
    ``groups`` and ``valid`` (B, N)), ties in score broken by the lower index: NMS within each group, by
    shifting each group's boxes by ``group * (largest coordinate of the image + 1)`` and running one NMS on
    the candidates' ranks (``TopK``, which puts the lower index first among equal scores), so that the order
    among equal scores is fixed; :func:`nms_padded`'s indices (B, max_output)."""
    largest = torch.where(valid[..., None], boxes, torch.full_like(boxes, float('-inf'))).flatten(1).amax(1)
    largest = torch.where(torch.isfinite(largest), largest, torch.zeros_like(largest))
    shifted = boxes + (groups.to(boxes.dtype) * (largest[:, None] + 1))[..., None]
    count = scores.shape[1]
    order = torch.where(valid, scores, torch.full_like(scores, float('-inf'))).topk(count, dim=1).indices
    descending = torch.arange(count, 0, -1, device=scores.device).to(scores.dtype)  # count .. 1 by rank
    ranks = torch.zeros_like(scores).scatter(1, order, descending.expand_as(scores))
    return nms_padded(shifted, torch.where(valid, ranks, torch.zeros_like(ranks)), iou_threshold, 0.5, max_output)


def _gather_rows(values: Tensor, index: Tensor) -> Tensor:
    """``values`` (B, N, ...) at ``index`` (B, K) along N: (B, K, ...)."""
    index = index.reshape(*index.shape, *([1] * (values.dim() - 2))).expand(*index.shape, *values.shape[2:])
    return values.gather(1, index)


def _decode(coder: nn.Module, priors: Tensor, deltas: Tensor, height, width) -> Tensor:
    """``coder.decode`` (mmdet's ``delta2bbox``) of ``deltas`` (..., 4) at ``priors`` (..., 4), clipped to the
    image as mmdet clips with ``max_shape`` (``height`` and ``width`` may be symbolic: clipped here)."""
    from mmdet.models.task_modules.coders.delta_xywh_bbox_coder import delta2bbox
    boxes = delta2bbox(priors.reshape(-1, 4), deltas.reshape(-1, 4), coder.means, coder.stds,
                       clip_border=False).reshape(deltas.shape)
    if not coder.clip_border:
        return boxes
    x, y = boxes[..., 0::2].clamp(min=0, max=width), boxes[..., 1::2].clamp(min=0, max=height)
    return torch.stack([x[..., 0], y[..., 0], x[..., 1], y[..., 1]], dim=-1)


def check_supported(model: nn.Module) -> None:
    """Raise :class:`UnsupportedDetector` unless ``model`` is a two-stage detector of the parts
    :class:`MaskRCNNExport` reproduces."""
    from mmcv.ops import RoIAlign
    from mmdet.models.dense_heads import RPNHead
    from mmdet.models.detectors import TwoStageDetector
    from mmdet.models.roi_heads import StandardRoIHead
    from mmdet.models.roi_heads.mask_heads import FCNMaskHead
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
    from mmdet.models.task_modules.coders import DeltaXYWHBBoxCoder

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise UnsupportedDetector(f'{type(model).__name__}: {what} (the whole-detector export covers '
                                      'Mask R-CNN: RPNHead, StandardRoIHead with RoIAlign and FCNMaskHead)')

    need(isinstance(model, TwoStageDetector), 'not a two-stage detector')
    rpn, roi = model.rpn_head, model.roi_head
    need(type(rpn) is RPNHead and rpn.use_sigmoid_cls, 'the RPN is not an RPNHead with sigmoid scores')
    need(type(roi) is StandardRoIHead and roi.with_mask and type(roi.mask_head) is FCNMaskHead,
         'the RoI head is not a StandardRoIHead with an FCNMaskHead')
    need(not roi.with_shared_head and not roi.mask_head.class_agnostic, 'a shared head or a class-agnostic mask')
    need(not getattr(roi.bbox_head, 'custom_cls_channels', False), 'a custom classifier')
    for coder in (rpn.bbox_coder, roi.bbox_head.bbox_coder):
        need(type(coder) is DeltaXYWHBBoxCoder and not coder.add_ctr_clamp, 'a box coder other than delta_xywh')
    for extractor in (roi.bbox_roi_extractor, roi.mask_roi_extractor):
        need(type(extractor) is SingleRoIExtractor, 'a RoI extractor other than SingleRoIExtractor')
        for layer in extractor.roi_layers:
            need(type(layer) is RoIAlign and layer.aligned and layer.pool_mode == 'avg',
                 'a RoI layer other than RoIAlign(aligned=True, pool_mode="avg")')
    for cfg in (rpn.test_cfg, roi.test_cfg):
        nms = dict(cfg.nms)
        need(nms.pop('type', 'nms') == 'nms' and set(nms) <= {'iou_threshold'}, f'an NMS other than plain nms: {nms}')
    need(roi.test_cfg.mask_thr_binary >= 0 and roi.test_cfg.max_per_img > 0 and rpn.test_cfg.max_per_img > 0,
         'a test_cfg without max_per_img or a binary mask threshold')


class MaskRCNNExport(nn.Module):
    """``model.predict`` of a Mask R-CNN in ops the ONNX exporter translates, batched: images (B, 3, H, W),
    normalized as after the data preprocessor, -> the tensors of :func:`output_names`. Every size follows the
    input's (the anchors from the feature maps' sizes, each level's top-k bounded by its anchors), so one file
    serves any batch and size when exported with dynamic axes.

    Per image: the RPN's objectness and deltas at every anchor, the top ``nms_pre`` of each level, decoded
    and clipped, boxes of zero width or height dropped, NMS per level (``max_per_img`` proposals); RoIAlign of
    each proposal once, at the FPN level mmdet assigns it (:meth:`_roi_features`), the box head, decoding per
    class, the candidates above ``score_thr``, NMS per class (``max_per_img`` detections); the mask head on
    the detections' boxes (only theirs: their number is known at run time), its class's probabilities
    (``mask_probs``) and, with ``paste_masks``, those pasted
    into the image and thresholded at ``mask_thr_binary`` (``masks``). Counts are outputs and rows past them
    padding. Ties in score are broken by the lower index in both NMS stages (:func:`_offset_nms`)."""

    onnx_translations = TRANSLATIONS

    def __init__(self, model: nn.Module, paste_masks: bool = False) -> None:
        super().__init__()
        check_supported(model)
        self.model = model.eval()
        self.paste_masks = paste_masks
        self.output_names = output_names(paste_masks)

    @staticmethod
    def _roi_features(extractor: nn.Module, feats: Sequence[Tensor], rois: Tensor) -> Tensor:
        """RoIAlign of ``rois`` (R, 5: image, x1, y1, x2, y2), each once, on the level
        ``extractor.map_roi_levels`` assigns it: one RoIAlign per level, on the RoIs of that level (their number
        is known at run time; none is allowed). The RoIs are pooled in the order of their level, image and
        corner (then put back in theirs): RoIAlign reads a window of every channel's plane per RoI, and a RoI
        near the one before finds much of its window in cache."""
        feats = feats[:extractor.num_inputs]
        layers = extractor.roi_layers
        levels = extractor.map_roi_levels(rois, len(feats))
        scales = torch.tensor([layer.spatial_scale for layer in layers], dtype=rois.dtype, device=rois.device)
        # the sort key: level, image, then the corner's row and column on the level's map (bounded by the
        # finest map's size)
        height, width = feats[0].shape[2], feats[0].shape[3]
        corner = (rois[:, 1:3] * scales[levels][:, None]).clamp(min=0).floor()
        key = (levels * feats[0].shape[0] + rois[:, 0].to(levels.dtype)).to(rois.dtype)
        key = (key * height + corner[:, 1].clamp(max=height - 1)) * width + corner[:, 0].clamp(max=width - 1)
        order = key.argsort()
        rois, levels = rois[order], levels[order]
        pooled = [torchvision.ops.roi_align(feat, rois[(levels == level).nonzero().squeeze(1)], layer.output_size,
                                            layer.spatial_scale, layer.sampling_ratio, aligned=True)
                  for level, (feat, layer) in enumerate(zip(feats, layers))]
        return torch.cat(pooled)[order.argsort()]

    def forward(self, images: Tensor) -> Tuple[Tensor, ...]:
        model = self.model
        rpn, roi = model.rpn_head, model.roi_head
        rpn_cfg, rcnn_cfg = rpn.test_cfg, roi.test_cfg
        batch, height, width = images.shape[0], images.shape[2], images.shape[3]
        feats = model.extract_feat(images)
        cls_maps, delta_maps = rpn(feats)
        anchors = rpn.prior_generator.grid_priors([m.shape[-2:] for m in cls_maps], dtype=images.dtype,
                                                  device=images.device)
        # RPN: the top nms_pre anchors of each level, decoded, NMS per level
        all_scores, all_deltas, scores, deltas, priors, levels = [], [], [], [], [], []
        nms_pre = rpn_cfg.get('nms_pre', -1)
        for level, (cls_map, delta_map, level_anchors) in enumerate(zip(cls_maps, delta_maps, anchors)):
            level_scores = cls_map.permute(0, 2, 3, 1).reshape(batch, -1).sigmoid()
            level_deltas = delta_map.permute(0, 2, 3, 1).reshape(batch, -1, 4)
            all_scores.append(level_scores)
            all_deltas.append(level_deltas)
            level_priors = level_anchors.expand(batch, -1, -1)
            if nms_pre > 0:
                level_scores, top = level_scores.topk(torch.sym_min(nms_pre, level_scores.shape[1]), dim=1)
                level_deltas, level_priors = _gather_rows(level_deltas, top), _gather_rows(level_priors, top)
            scores.append(level_scores)
            deltas.append(level_deltas)
            priors.append(level_priors)
            levels.append(torch.full_like(level_scores, level, dtype=torch.int64))
        scores, levels = torch.cat(scores, dim=1), torch.cat(levels, dim=1)
        boxes = _decode(rpn.bbox_coder, torch.cat(priors, dim=1), torch.cat(deltas, dim=1), height, width)
        valid = torch.ones_like(scores, dtype=torch.bool)
        min_size = rpn_cfg.get('min_bbox_size', -1)
        if min_size >= 0:
            valid = ((boxes[..., 2] - boxes[..., 0]) > min_size) & ((boxes[..., 3] - boxes[..., 1]) > min_size)
        keep = _offset_nms(boxes, scores, levels, valid, rpn_cfg.nms.iou_threshold, rpn_cfg.max_per_img)
        proposal_valid = keep >= 0  # (B, P)
        num_proposals = proposal_valid.sum(1)
        proposals = _gather_rows(boxes, keep.clamp(min=0)) * proposal_valid[..., None]

        # box head on the proposals, decoding per class, NMS per class
        image_index = torch.arange(batch, device=images.device).to(images.dtype)
        rois = torch.cat([image_index[:, None, None].expand(-1, proposals.shape[1], 1), proposals], dim=2)
        cls_score, bbox_pred = roi.bbox_head(self._roi_features(roi.bbox_roi_extractor, feats, rois.reshape(-1, 5)))
        num_proposals_per_image = proposals.shape[1]
        roi_scores = F.softmax(cls_score, dim=-1).reshape(batch, num_proposals_per_image, -1)
        bbox_pred = bbox_pred.reshape(batch, num_proposals_per_image, -1)
        num_classes = roi.bbox_head.num_classes
        per_class = 1 if roi.bbox_head.reg_class_agnostic else num_classes
        class_boxes = _decode(roi.bbox_head.bbox_coder, proposals[:, :, None, :].expand(-1, -1, per_class, 4),
                              bbox_pred.reshape(batch, -1, per_class, 4), height, width)
        class_boxes = class_boxes.expand(-1, -1, num_classes, 4).reshape(batch, -1, 4)
        candidate_scores = roi_scores[..., :-1].reshape(batch, -1)
        labels = torch.arange(num_classes, device=images.device).repeat(num_proposals_per_image)
        candidates = (candidate_scores > rcnn_cfg.score_thr) & proposal_valid.repeat_interleave(num_classes, dim=1)
        keep = _offset_nms(class_boxes, candidate_scores, labels.expand(batch, -1), candidates,
                           rcnn_cfg.nms.iou_threshold, rcnn_cfg.max_per_img)
        det_valid = keep >= 0  # (B, K)
        num_dets = det_valid.sum(1)
        keep = keep.clamp(min=0)
        det_boxes = _gather_rows(class_boxes, keep) * det_valid[..., None]
        det_scores = candidate_scores.gather(1, keep) * det_valid
        det_labels = torch.where(det_valid, labels[keep], torch.full_like(keep, -1))

        # mask head on the detections only (their number is known at run time): the label's probabilities, in
        # the padded layout, pasted into the image if asked
        rois = torch.cat([image_index[:, None, None].expand(-1, det_boxes.shape[1], 1), det_boxes], dim=2)
        detected = det_valid.reshape(-1).nonzero().squeeze(1)
        mask_logits = roi.mask_head(self._roi_features(roi.mask_roi_extractor, feats, rois.reshape(-1, 5)[detected]))
        mask_size = mask_logits.shape[2:]
        probs = mask_logits.sigmoid().gather(
            1, det_labels.reshape(-1)[detected].reshape(-1, 1, 1, 1).expand(-1, 1, *mask_size)).squeeze(1)
        mask_probs = probs.new_zeros(det_valid.numel(), *mask_size).index_put((detected, ), probs)
        mask_probs = mask_probs.reshape(batch, -1, *mask_size)
        masks = ()
        if self.paste_masks:
            pasted = paste_masks(mask_probs.reshape(-1, *mask_size), det_boxes.reshape(-1, 4), height, width,
                                 rcnn_cfg.mask_thr_binary)
            masks = (pasted.reshape(batch, -1, height, width) & det_valid[..., None, None], )
        roi_scores = roi_scores * proposal_valid[..., None]
        roi_deltas = bbox_pred * proposal_valid[..., None]
        return (num_dets, det_boxes, det_scores, det_labels, mask_probs, *masks, torch.cat(all_scores, dim=1),
                torch.cat(all_deltas, dim=1), num_proposals, proposals, roi_scores, roi_deltas)


def data_samples(batch: int, height: int, width: int) -> list:
    """mmdet data samples for ``model.predict`` on a preprocessed batch of ``height`` x ``width`` images,
    unscaled (``ori_shape`` = ``img_shape``, scale factor 1), so its results are in input pixels."""
    from mmdet.structures import DetDataSample
    meta = dict(img_shape=(height, width), ori_shape=(height, width), pad_shape=(height, width),
                batch_input_shape=(height, width), scale_factor=(1.0, 1.0))
    return [DetDataSample(metainfo=dict(meta)) for _ in range(batch)]


class DetectionComparison(NamedTuple):
    """:func:`compare_with_predict` for one image: the largest relative differences of the outputs before
    NMS (``rpn``: objectness and deltas of every anchor; ``roi``: class scores and deltas of the file's
    proposals, against mmdet's box head on them), of the proposals' and detections' boxes (matched), the largest
    score difference of the detections, the smallest mask IoU (the file's ``mask_probs`` pasted by
    :func:`~mmppma.deploy.masks.paste_masks`, and its ``masks`` if it has them), the masks below the IoU
    bound whose pixels differ only where mmdet's probability is within :data:`MASK_PROB_TOLERANCE` of the threshold, the
    detections (ONNX, reference), the smallest gap between the reference's consecutive scores (how far
    its order is from a tie), and whether mmdet's RPN kept other proposals than with the order among equal
    scores fixed (:func:`tie_broken_proposals`; then the reference is mmdet's RoI head on those)."""
    rpn: float
    roi: float
    proposals: float
    boxes: float
    scores: float
    mask_iou: float
    near_threshold: int
    detections: Tuple[int, int]
    score_gap: float
    ties: bool


def _box_difference(got: Tensor, want: Tensor) -> float:
    """The largest relative difference of boxes ``got`` (M, 4) from ``want`` (N, 4), each of ``want``'s matched
    to one of ``got``'s (:func:`_match`); infinite if their numbers differ."""
    if len(got) != len(want):
        return float('inf')
    return relative_difference(got[_match(got, want)], want) if len(want) else 0.0


def _match(got: Tensor, want: Tensor) -> Tensor:
    """For each box of ``want`` (N, 4), the index of the box of ``got`` (M, 4) nearest to it (largest
    coordinate difference), each used once, taken greedily in ``want``'s order."""
    distance = (want[:, None, :] - got[None, :, :]).abs().amax(-1)
    picked = []
    for row in distance:
        if picked:
            row = row.clone()
            row[picked] = float('inf')
        picked.append(int(row.argmin()))
    return torch.tensor(picked, dtype=torch.int64)


def mask_iou(got: Tensor, want: Tensor) -> Tensor:
    """IoU of boolean masks (N, H, W), pairwise by row; 1 where both are empty."""
    inter = (got & want).flatten(1).sum(1).double()
    union = (got | want).flatten(1).sum(1).double()
    return torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))


def pasted_probabilities(model: nn.Module, feats: Sequence[Tensor], instances, height: int,
                         width: int) -> Tensor:
    """mmdet's mask probabilities of ``instances`` (boxes and labels of one image, ``feats`` its features)
    pasted into the image before the threshold (N, H, W): its mask head and ``_do_paste_mask``."""
    from mmdet.models.roi_heads.mask_heads.fcn_mask_head import _do_paste_mask
    from mmdet.structures.bbox import bbox2roi
    with torch.no_grad():
        logits = model.roi_head._mask_forward(feats, bbox2roi([instances.bboxes]))['mask_preds']
        probs = logits.sigmoid()[torch.arange(len(instances)), instances.labels][:, None]
        return _do_paste_mask(probs, instances.bboxes, height, width, skip_empty=False)[0]


def tie_broken_proposals(model: nn.Module, scores: Tensor, deltas: Tensor, featmap_sizes: Sequence[Tuple[int, int]],
                         height: int, width: int):
    """mmdet's RPN post-processing (``RPNHead._predict_by_feat_single``: the top ``nms_pre`` anchors of each
    level, decoded and clipped, the empty ones dropped, ``batched_nms`` per level, the first ``max_per_img``)
    of one image's objectness ``scores`` (A,) and ``deltas`` (A, 4) (mmdet's order of the anchors, levels of
    ``featmap_sizes``), with the order among equal scores fixed as the export fixes it: the lower index first,
    in a stable sort and in the NMS (its scores replaced by their ranks). mmdet's ``sort`` and NMS order equal
    scores as their kernels happen to, which decides the proposals when many objectness scores are equal (a
    saturated sigmoid). An ``InstanceData`` of ``bboxes`` and ``scores``, as ``rpn_head.predict``'s."""
    from mmcv.ops import batched_nms
    from mmengine.structures import InstanceData
    rpn = model.rpn_head
    cfg = rpn.test_cfg
    anchors = rpn.prior_generator.grid_priors(featmap_sizes, dtype=deltas.dtype, device=deltas.device)
    sizes = [len(level_anchors) for level_anchors in anchors]
    ranked = []
    for level, (level_scores, level_deltas, level_anchors) in enumerate(zip(scores.split(sizes),
                                                                            deltas.split(sizes), anchors)):
        if 0 < cfg.get('nms_pre', -1) < level_scores.shape[0]:
            level_scores, top = level_scores.sort(descending=True, stable=True)
            level_scores, top = level_scores[:cfg.nms_pre], top[:cfg.nms_pre]
            level_deltas, level_anchors = level_deltas[top], level_anchors[top]
        ranked.append((level_scores, level_deltas, level_anchors,
                       torch.full_like(level_scores, level, dtype=torch.int64)))
    scores, deltas, priors, levels = (torch.cat(parts) for parts in zip(*ranked))
    boxes = rpn.bbox_coder.decode(priors, deltas, max_shape=(height, width))
    if cfg.get('min_bbox_size', -1) >= 0:
        valid = ((boxes[:, 2] - boxes[:, 0]) > cfg.min_bbox_size) & ((boxes[:, 3] - boxes[:, 1]) > cfg.min_bbox_size)
        boxes, scores, levels = boxes[valid], scores[valid], levels[valid]
    ranks = torch.empty_like(scores)
    ranks[scores.sort(descending=True, stable=True)[1]] = torch.arange(len(scores), 0, -1, dtype=scores.dtype)
    keep = batched_nms(boxes, ranks, levels, cfg.nms)[1][:cfg.max_per_img] if len(boxes) else levels
    return InstanceData(bboxes=boxes[keep], scores=scores[keep])


def run_onnx(path: str, images: Tensor) -> Dict[str, Tensor]:
    """The ONNX file's outputs (:data:`OUTPUT_NAMES`) on ``images`` in onnxruntime (CPU). Raises
    :class:`~mmppma.deploy.runtime.OnnxRuntimeFailure` when it cannot load or run the file."""
    session = onnx_session(path)
    names = [o.name for o in session.get_outputs()]
    try:
        got = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    except Exception as err:  # onnxruntime's own exception types, all reported alike
        raise OnnxRuntimeFailure(f'at input {tuple(images.shape)}: {first_line(err)}') from err
    return {name: torch.from_numpy(value) for name, value in zip(names, got)}


def compare_with_predict(path: str, model: nn.Module, images: Tensor, tolerance: float = 1e-4,
                         box_tolerance: float = BOX_TOLERANCE,
                         min_mask_iou: float = MASK_IOU) -> List[DetectionComparison]:
    """Run the ONNX file of :class:`MaskRCNNExport` in onnxruntime (CPU) on ``images`` and compare it, per
    image, with mmdet: ``model.predict`` for the detections, ``rpn_head.predict`` for the proposals, and for
    the outputs before NMS the RPN head's outputs and the box head's on the file's proposals. Where equal
    objectness scores (a saturated sigmoid) make mmdet's RPN keep other proposals than with the order among
    them fixed, the proposals are compared with :func:`tie_broken_proposals` and the detections with mmdet's
    RoI head (``roi_head.predict``) on those: the order among equal scores is then no difference. Raises
    :class:`DetectionMismatch` when the outputs before NMS differ by more than ``tolerance`` (relative), the
    proposals or detections differ in number, their boxes by more than ``box_tolerance`` (relative, after
    matching), the detections' scores by more than ``tolerance`` or their labels at all, or a mask's IoU is
    below ``min_mask_iou`` with a pixel differing where mmdet's probability is farther than
    :data:`MASK_PROB_TOLERANCE` from the threshold."""
    from mmdet.structures.bbox import bbox2roi
    got = run_onnx(path, images)
    samples = data_samples(*images.shape[:1], *images.shape[2:])
    with torch.no_grad():
        results = model.predict(images, samples)
        feats = model.extract_feat(images)
        cls_maps, delta_maps = model.rpn_head(feats)
        proposals = model.rpn_head.predict(feats, data_samples(*images.shape[:1], *images.shape[2:]),
                                           rescale=False)
    comparisons = []
    for b, (result, proposal) in enumerate(zip(results, proposals)):
        where = f'image {b}'
        image_feats = [f[b:b + 1] for f in feats]
        want = result.pred_instances
        rpn_scores = torch.cat([m[b].permute(1, 2, 0).reshape(-1) for m in cls_maps]).sigmoid()
        rpn_deltas = torch.cat([m[b].permute(1, 2, 0).reshape(-1, 4) for m in delta_maps])
        rpn = max(relative_difference(got['rpn_scores'][b], rpn_scores),
                  relative_difference(got['rpn_deltas'][b], rpn_deltas))
        n = int(got['num_proposals'][b])
        proposal_diff = _box_difference(got['proposals'][b, :n], proposal.bboxes)
        ties = not proposal_diff <= box_tolerance
        if ties:  # mmdet's RPN post-processing on the file's objectness and deltas, ties broken by index
            proposal = tie_broken_proposals(model, got['rpn_scores'][b], got['rpn_deltas'][b],
                                            [m.shape[-2:] for m in cls_maps], *images.shape[2:])
            proposal_diff = _box_difference(got['proposals'][b, :n], proposal.bboxes)
            with torch.no_grad():  # and mmdet's RoI head on its proposals
                want = model.roi_head.predict(image_feats, [proposal], samples[b:b + 1], rescale=False)[0]
        if n != len(proposal):
            raise DetectionMismatch(f'{where}: {n} proposals, mmdet {len(proposal)}')
        with torch.no_grad():  # mmdet's box head on the file's proposals
            head = model.roi_head._bbox_forward(image_feats, bbox2roi([got['proposals'][b, :n]]))
        roi = max(relative_difference(got['roi_scores'][b, :n], F.softmax(head['cls_score'], dim=-1)),
                  relative_difference(got['roi_deltas'][b, :n], head['bbox_pred']))
        n = int(got['num_dets'][b])
        gaps = (want.scores[:-1] - want.scores[1:]).abs()
        gap = float(gaps.min()) if len(gaps) else float('inf')
        if n != len(want):
            raise DetectionMismatch(f'{where}: {n} detections, mmdet {len(want)} (smallest gap between '
                                    f'its scores {gap:.1e})')
        matched = _match(got['boxes'][b, :n], want.bboxes) if n else torch.zeros(0, dtype=torch.int64)
        boxes = relative_difference(got['boxes'][b, matched], want.bboxes) if n else 0.0
        scores = float((got['scores'][b, matched] - want.scores).abs().max()) if n else 0.0
        threshold = model.roi_head.test_cfg.mask_thr_binary
        image_masks = []
        if 'mask_probs' in got:  # the file's masks, pasted as the docs say
            image_masks.append(paste_masks(got['mask_probs'][b, matched], got['boxes'][b, matched],
                                           *images.shape[2:], threshold=threshold))
        if 'masks' in got:  # and those it pasted itself
            image_masks.append(got['masks'][b, matched])
        ious, low, near = torch.ones(1), 0, 0
        for masks in image_masks if n else ():
            source_ious = mask_iou(masks, want.masks.bool())
            ious = torch.minimum(ious, source_ious.min())
            source_low = (source_ious < min_mask_iou).nonzero().squeeze(1)
            low += len(source_low)
            if len(source_low):  # the pixels that differ, against mmdet's probabilities there
                probs = pasted_probabilities(model, image_feats, want[source_low],
                                             *images.shape[2:])
                differ = masks[source_low] != want.masks[source_low].bool()
                margin = (probs - threshold).abs()
                near += int(((margin <= MASK_PROB_TOLERANCE) | ~differ).flatten(1).all(1).sum())
        comparison = DetectionComparison(rpn, roi, proposal_diff, boxes, scores, float(ious.min()), near,
                                         (n, len(want)), gap, ties)
        comparisons.append(comparison)
        if not rpn <= tolerance or not roi <= tolerance:
            raise DetectionMismatch(f'{where}: the outputs before NMS differ by {max(rpn, roi):.3e} (relative) '
                                    f'> {tolerance:g}')
        if not (proposal_diff <= box_tolerance and boxes <= box_tolerance):
            raise DetectionMismatch(f'{where}: the boxes differ by {max(proposal_diff, boxes):.3e} (relative, '
                                    f'matched) > {box_tolerance:g}')
        if n and not torch.equal(got['labels'][b, matched], want.labels):
            raise DetectionMismatch(f'{where}: the labels differ')
        if not scores <= tolerance:
            raise DetectionMismatch(f'{where}: the scores differ by {scores:.3e} > {tolerance:g}')
        if near < low:
            raise DetectionMismatch(f'{where}: {low - near} mask(s) with an IoU below {min_mask_iou:g} (smallest '
                                    f'{comparison.mask_iou:.4f}) differ where mmdet\'s probability is more than '
                                    f'{MASK_PROB_TOLERANCE:g} from the threshold')
    return comparisons
