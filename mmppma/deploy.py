"""ONNX export of mmppma's models and the check of the exported file against torch (tools/deployment).

:func:`export_module` picks the part of a model that is exported (:data:`OUTPUTS`), :func:`export_onnx` traces it with
``torch.onnx.export(dynamo=True)`` under :func:`mmppma.ops.export_mode` (plain PyTorch ops throughout; fixed-grid
pools with bins taken from the input size at run time, :func:`runtime_pools`) and turns a failure into an
:class:`ExportError` naming the op, and :func:`compare_onnx` runs the file in onnxruntime on CPU against the torch
module (:class:`OnnxRuntimeFailure`, :class:`OutputMismatch` when it cannot). Needs the ``deploy`` extra (onnx,
onnxscript, onnxruntime).
"""
import contextlib
import re
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.models.layers.adaptive_pool import RUNTIME_FORMS, runtime_form
from mmppma.ops import export_mode

#: largest relative difference (:func:`compare_onnx`) that counts as the same output
TOLERANCE = 1e-4
#: what each kind of model exports (:func:`export_module`)
OUTPUTS = {
    'classifier': 'logits (B, classes)',
    'segmentor': 'segmentation logits (B, classes, H, W) at the input size',
    'detector': 'the whole Mask R-CNN: detections after NMS (boxes, scores, labels, masks; padded, with their '
                'count) and the RPN and box head outputs before NMS (mmppma.deploy_mask_rcnn)',
    'backbone': "the backbone's multi-scale features (its out_indices)",
}


class ExportError(RuntimeError):
    """The exporter could not translate the model; ``op`` names the operator it stopped at (None if the
    exporter's message names none)."""

    def __init__(self, message: str, op: Optional[str] = None) -> None:
        super().__init__(message)
        self.op = op


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
    """x -> the tuple of feature maps of a backbone (or, with ``detector``, of a detector's backbone and
    neck)."""

    def __init__(self, model: nn.Module, detector: bool) -> None:
        super().__init__()
        self.model, self.detector = model, detector

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.model.extract_feat(x) if self.detector else self.model(x))


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


def export_module(model: nn.Module) -> Tuple[nn.Module, str]:
    """``(module, kind)``: the part of ``model`` that is exported, as a module of one image tensor
    (B, 3, H, W) (normalized, as after the data preprocessor), and its :func:`model_kind` (see
    :data:`OUTPUTS`). A detector is :class:`mmppma.deploy_mask_rcnn.MaskRCNNExport`, which raises
    :class:`mmppma.deploy_mask_rcnn.UnsupportedDetector` for a detector other than Mask R-CNN."""
    kind = model_kind(model)
    if kind == 'detector':
        from mmppma.deploy_mask_rcnn import MaskRCNNExport
        return MaskRCNNExport(model).eval(), kind
    wrapped = {'classifier': _Classifier, 'segmentor': _Segmentor}.get(kind)
    module = wrapped(model) if wrapped else _Features(model, detector=False)
    return module.eval(), kind


def _failed_op(message: str) -> Optional[str]:
    """The operator an exporter's message names: ``OpOverload(op='ns.name')`` (no ONNX translation),
    ``aten::name`` (TorchScript exporter), or ``torch.ops.ns.name`` (an FX node)."""
    for pattern in (r"OpOverload\(op='([\w.]+)'", r"operator '?(\w+::\w+)'?", r'torch\.ops\.([\w.]+?)(?:\.default)?\b'):
        found = re.search(pattern, message)
        if found:
            return found.group(1).replace('.', '::', 1) if '::' not in found.group(1) else found.group(1)
    return None


def fixed_grid_pools(module: nn.Module) -> List[str]:
    """Names of the submodules that pool to a fixed grid other than 1 x 1 (``nn.AdaptiveAvgPool2d`` /
    ``AdaptiveMaxPool2d``, as UPerNet's pyramid pooling): torch.onnx translates them with gather indices of the
    traced input size, wrong at any other size, so :func:`export_onnx` exports them in their run-time form
    (:mod:`mmppma.models.layers.adaptive_pool`)."""
    pools = tuple(RUNTIME_FORMS)
    return [name for name, m in module.named_modules()
            if type(m) in pools and torch.nn.modules.utils._pair(m.output_size) != (1, 1)]


@contextlib.contextmanager
def runtime_pools(module: nn.Module) -> Iterator[List[str]]:
    """Inside: the :func:`fixed_grid_pools` of ``module`` replaced by their forms with run-time bins (the same
    pooling in eager mode, and an export that holds at any input size); the originals are put back on exit.
    Yields the names replaced."""
    names = fixed_grid_pools(module)
    swapped = []
    try:
        for name in names:
            parent_name, _, child = name.rpartition('.')
            parent = module.get_submodule(parent_name)
            original = parent._modules[child]
            parent._modules[child] = runtime_form(original)
            swapped.append((parent, child, original))
        yield names
    finally:
        for parent, child, original in swapped:
            parent._modules[child] = original


def traced_input(x: torch.Tensor) -> torch.Tensor:
    """The input a dynamic export traces: ``x``, its images repeated to a batch of 2 if it holds one."""
    return x.repeat(2, 1, 1, 1) if x.shape[0] == 1 else x


def export_onnx(module: nn.Module, x: torch.Tensor, path: str, dynamic: bool = False, opset: int = 18,
                optimize: bool = True) -> None:
    """Export ``module`` (one tensor in) at input ``x`` to the ONNX file ``path`` (weights inside), tracing
    its plain PyTorch paths (:func:`mmppma.ops.export_mode`), fixed-grid pools in their run-time form
    (:func:`runtime_pools`). ``dynamic``: batch, height and width are dynamic wherever the model allows
    (``torch.export.Dim.AUTO``: an axis the model fixes stays static; see :func:`dynamic_axes`). ``optimize``:
    run onnxscript's graph optimizer on the result (constant folding, fusions). Raises :class:`ExportError`
    naming the op the exporter failed on.

    A dynamic export is traced at a batch of at least 2 (:func:`traced_input`): traced at 1, ``torch.export``
    specializes the axis ("0/1 specialization") in part of the graph, whose broadcasts and reshapes then hold a
    batch of 1 that onnxruntime rejects at any other batch.

    A module with ``output_names`` names the file's outputs so; one with ``onnx_translations`` (a
    ``custom_translation_table``) has its own ops translated by them
    (:class:`mmppma.deploy_mask_rcnn.MaskRCNNExport`)."""
    shapes = None
    if dynamic:
        shapes = ({axis: torch.export.Dim.AUTO for axis in (0, 2, 3)}, )
        x = traced_input(x)
    try:
        with export_mode(), runtime_pools(module), torch.no_grad():
            torch.onnx.export(module, (x, ), path, dynamo=True, opset_version=opset, dynamic_shapes=shapes,
                              external_data=False, input_names=['input'], optimize=optimize, verbose=False,
                              output_names=list(getattr(module, 'output_names', ())) or None,
                              custom_translation_table=getattr(module, 'onnx_translations', None))
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


class Comparison(NamedTuple):
    shape: Tuple[int, ...]
    max_rel_diff: float


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max |want|``: the largest deviation relative to the output's scale (an
    element-wise ratio would divide by outputs near zero)."""
    scale = want.abs().max().clamp_min(torch.finfo(want.dtype).tiny)
    return float((got - want).abs().max() / scale)


class OnnxRuntimeFailure(RuntimeError):
    """onnxruntime could not load or run the exported file (:func:`compare_onnx`)."""


class OutputMismatch(RuntimeError):
    """The ONNX file's outputs are not torch's in number or shape (:func:`compare_onnx`)."""


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, after its type's name."""
    line = next((line.strip() for line in str(err).splitlines() if line.strip()), '')
    return f'{type(err).__name__}: {line}' if line else type(err).__name__


def compare_onnx(path: str, module: nn.Module, inputs: Sequence[torch.Tensor]) -> List[Comparison]:
    """Run the ONNX file in onnxruntime (CPU) and ``module`` in torch eager on each input; per input, the
    largest :func:`relative_difference` over the outputs. Raises :class:`OnnxRuntimeFailure` when onnxruntime
    cannot load the file or run it at an input, :class:`OutputMismatch` when its outputs differ from torch's
    in number or shape."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failed run is raised (and reported once) by the caller
    try:
        session = onnxruntime.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    except Exception as err:  # onnxruntime's own exception types, all reported alike
        raise OnnxRuntimeFailure(f'could not load {path}: {first_line(err)}') from err
    name = session.get_inputs()[0].name
    results = []
    for x in inputs:
        try:
            got = session.run(None, {name: x.numpy()})
        except Exception as err:
            raise OnnxRuntimeFailure(f'at input {tuple(x.shape)}: {first_line(err)}') from err
        with torch.no_grad():
            want = module(x)
        want = (want, ) if isinstance(want, torch.Tensor) else tuple(want)
        if len(got) != len(want):
            raise OutputMismatch(f'the ONNX model gives {len(got)} outputs, torch {len(want)}')
        for g, w in zip(got, want):
            if tuple(g.shape) != tuple(w.shape):
                raise OutputMismatch(f'at input {tuple(x.shape)} onnxruntime gives an output of shape '
                                     f'{tuple(g.shape)}, torch {tuple(w.shape)}')
        diff = max(relative_difference(torch.from_numpy(g), w) for g, w in zip(got, want))
        results.append(Comparison(tuple(x.shape), diff))
    return results
