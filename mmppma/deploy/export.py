"""ONNX export of mmppma's models (tools/deployment).

:func:`export_module` picks the part of a model that is exported (:data:`OUTPUTS`), and :func:`export_onnx`
traces it with ``torch.onnx.export(dynamo=True)`` under :func:`mmppma.ops.export_mode` (plain PyTorch ops
throughout; fixed-grid pools with bins taken from the input size at run time,
:func:`mmppma.deploy.pools.runtime_pools`; GELU in the order of ops onnxruntime fuses, :data:`TRANSLATIONS`) and
turns a failure into an :class:`~mmppma.deploy.runtime.ExportError` naming the op. Needs the ``deploy`` extra
(onnx, onnxscript, onnxruntime).
"""
import math
import re
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.ops import export_mode

from .pools import runtime_pools
from .runtime import ExportError
from .targets import ONNXRUNTIME_CPU, ExportTarget

#: what each kind of model exports (:func:`export_module`)
OUTPUTS = {
    'classifier': 'logits (B, classes)',
    'segmentor': 'segmentation logits (B, classes, H, W) at the input size',
    'detector': 'the whole Mask R-CNN: detections after NMS (boxes, scores, labels, mask probabilities at RoI '
                'resolution; padded, with their count) and the RPN and box head outputs before NMS '
                '(mmppma.deploy.mask_rcnn)',
    'backbone': "the backbone's multi-scale features (its out_indices)",
}


def _gelu_onnx(x, approximate: str = 'none'):
    """``aten::gelu`` as ``(x * (1 + erf(x / sqrt 2))) * 0.5``, the order of ops onnxruntime fuses into one Gelu
    kernel (torch's own translation, ``x * (0.5 * (1 + erf(..)))``, stays five ops); ``'tanh'``:
    ``(x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))) * 0.5``. Fused once onnxscript's optimizer has folded
    the constants' casts (:func:`export_onnx`'s ``optimize``)."""
    from onnxscript import opset18 as op

    def const(value):  # in x's dtype (onnxscript's optimizer folds it)
        return op.CastLike(value, x)
    if approximate == 'tanh':
        inner = op.Mul(op.Add(x, op.Mul(op.Mul(op.Mul(x, x), x), const(0.044715))), const(math.sqrt(2 / math.pi)))
        return op.Mul(op.Mul(x, op.Add(op.Tanh(inner), const(1.0))), const(0.5))
    return op.Mul(op.Mul(x, op.Add(op.Erf(op.Div(x, const(math.sqrt(2)))), const(1.0))), const(0.5))


#: translations of torch ops every export uses (``torch.onnx.export(custom_translation_table=...)``)
TRANSLATIONS = {torch.ops.aten.gelu.default: _gelu_onnx}


class _Classifier(nn.Module):
    """An mmpretrain classifier as x -> logits (its ``mode='tensor'`` output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x, mode='tensor')


class _Segmentor(nn.Module):
    """An mmseg encoder-decoder as x -> the decode head's logits resized to x's size, as its inference does
    (bilinear, with the head's ``align_corners``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.model.decode_head(self.model.extract_feat(x))
        return F.interpolate(logits, size=x.shape[2:], mode='bilinear',
                             align_corners=self.model.decode_head.align_corners)


class _Features(nn.Module):
    """A backbone as x -> the tuple of its feature maps."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.model(x))


def model_kind(model: nn.Module) -> str:
    """'classifier' (mmpretrain), 'segmentor' (mmseg encoder-decoder), 'detector' (mmdet) or 'backbone'."""
    package = type(model).__module__.split('.')[0]
    if package == 'mmseg' and hasattr(model, 'decode_head'):
        return 'segmentor'
    if package == 'mmdet' and hasattr(model, 'extract_feat'):
        return 'detector'
    if package == 'mmpretrain' and hasattr(model, 'head'):
        return 'classifier'
    return 'backbone'


def export_module(model: nn.Module, paste_masks: bool = False) -> Tuple[nn.Module, str]:
    """``(module, kind)``: the part of ``model`` that is exported, as a module of one image tensor
    (B, 3, H, W) (normalized, as after the data preprocessor), and its :func:`model_kind` (see
    :data:`OUTPUTS`). A detector is :class:`mmppma.deploy.mask_rcnn.MaskRCNNExport`, which raises
    :class:`~mmppma.deploy.runtime.UnsupportedDetector` for a detector other than Mask R-CNN; ``paste_masks``:
    it also pastes the masks into the image (its ``masks`` output)."""
    kind = model_kind(model)
    if kind == 'detector':
        from .mask_rcnn import MaskRCNNExport
        return MaskRCNNExport(model, paste_masks=paste_masks).eval(), kind
    if paste_masks:
        raise ValueError(f'paste_masks is for a Mask R-CNN; this model is a {kind}')
    wrapped = {'classifier': _Classifier, 'segmentor': _Segmentor}.get(kind)
    module = wrapped(model) if wrapped else _Features(model)
    return module.eval(), kind


def _failed_op(message: str) -> Optional[str]:
    """The operator an exporter's message names: ``OpOverload(op='ns.name')`` (no ONNX translation),
    ``aten::name`` (TorchScript exporter), or ``torch.ops.ns.name`` (an FX node)."""
    for pattern in (r"OpOverload\(op='([\w.]+)'", r"operator '?(\w+::\w+)'?", r'torch\.ops\.([\w.]+?)(?:\.default)?\b'):
        found = re.search(pattern, message)
        if found:
            return found.group(1).replace('.', '::', 1) if '::' not in found.group(1) else found.group(1)
    return None


def traced_input(x: torch.Tensor) -> torch.Tensor:
    """The input a dynamic export traces: ``x``, its images repeated to a batch of 2 if it holds one."""
    return x.repeat(2, 1, 1, 1) if x.shape[0] == 1 else x


def export_onnx(module: nn.Module, x: torch.Tensor, path: str, dynamic: bool = False,
                target: ExportTarget = ONNXRUNTIME_CPU, optimize: bool = True) -> None:
    """Export ``module`` (one tensor in) at input ``x`` to the ONNX file ``path`` (weights inside) for the runtime
    ``target`` (:mod:`mmppma.deploy.targets`: its opset and the ops' export forms), tracing its plain PyTorch paths
    (:func:`mmppma.ops.export_mode`), fixed-grid pools in their run-time form
    (:func:`~mmppma.deploy.pools.runtime_pools`). ``dynamic``: batch, height and width are dynamic wherever the model
    allows (``torch.export.Dim.AUTO``: an axis the model fixes stays static; see :func:`dynamic_axes`). ``optimize``:
    run onnxscript's graph optimizer on the result (constant folding, fusions). Raises :class:`ExportError` naming the
    op the exporter failed on.

    A dynamic export is traced at a batch of at least 2 (:func:`traced_input`): traced at 1, ``torch.export``
    specializes the axis ("0/1 specialization") in part of the graph, whose broadcasts and reshapes then hold a
    batch of 1 that onnxruntime rejects at any other batch.

    A module with ``output_names`` names the file's outputs so; one with ``onnx_translations`` (a
    ``custom_translation_table``) has its own ops translated by them
    (:class:`mmppma.deploy.mask_rcnn.MaskRCNNExport`)."""
    shapes = None
    if dynamic:
        shapes = ({axis: torch.export.Dim.AUTO for axis in (0, 2, 3)}, )
        x = traced_input(x)
    try:
        with export_mode(target), runtime_pools(module), torch.no_grad():
            torch.onnx.export(module, (x, ), path, dynamo=True, opset_version=target.opset, dynamic_shapes=shapes,
                              external_data=False, input_names=['input'], optimize=optimize, verbose=False,
                              output_names=list(getattr(module, 'output_names', ())) or None,
                              custom_translation_table={**TRANSLATIONS,
                                                        **getattr(module, 'onnx_translations', {})})
    except Exception as err:  # the exporters raise many types; all are reported the same way
        message = str(err)
        op = _failed_op(message)
        where = f'at the operator {op}' if op else '(the exporter names no operator)'
        first = next((line for line in message.splitlines() if line.strip()), type(err).__name__)
        raise ExportError(f'ONNX export failed {where}: {first.strip()}\n'
                          f'(full exporter message below)\n{message}', op) from err


def dynamic_axes(path: str) -> List[str]:
    """The axes of the ONNX file's input that are dynamic, by name ('batch', 'height', 'width')."""
    import onnx
    dims = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    return [name for name, dim in zip(('batch', 'channels', 'height', 'width'), dims) if dim.dim_param]
