"""Deployment: ONNX export of mmppma's models and the check of the exported file against torch (tools/deployment).

Layered, each module importing only those before it (and the models, never the reverse):

* :mod:`.runtime` - the onnxruntime session, the errors, :func:`relative_difference`, :func:`first_line`;
* :mod:`.pools` - adaptive pools with bins taken from the input size at run time (the export's form);
* :mod:`.masks` - :func:`paste_masks`, a Mask R-CNN file's masks at RoI resolution pasted into the image
  (numpy or torch);
* :mod:`.targets` - the runtimes a file is made for (:data:`ONNXRUNTIME_CPU`: opset, where the attention ops loop);
* :mod:`.export` - the part of a model that is exported, and :func:`export_onnx`;
* :mod:`.build` - :func:`build_model`, a config's model as it is exported;
* :mod:`.mask_rcnn` - the whole Mask R-CNN as one graph, checked against ``model.predict`` (imported on use:
  it needs mmdet and registers an NMS op with torch.library);
* :mod:`.check` - :func:`compare_onnx`, the file in onnxruntime against the torch module;
* :mod:`.profile` - :func:`profile_onnx`, the file's onnxruntime time by op type and by model part.

Needs the ``deploy`` extra (onnx, onnxscript, onnxruntime).
"""
from .build import build_model
from .check import Comparison, compare_onnx
from .export import OUTPUTS, dynamic_axes, export_module, export_onnx, model_kind, traced_input
from .masks import paste_masks
from .pools import fixed_grid_pools, runtime_pools
from .profile import Profile, profile_onnx
from .runtime import (
    TOLERANCE,
    DetectionMismatch,
    ExportError,
    OnnxRuntimeFailure,
    OutputMismatch,
    UnsupportedDetector,
    first_line,
    onnx_session,
    relative_difference,
)
from .targets import ONNXRUNTIME_CPU, TARGETS, ExportTarget

__all__ = [
    'build_model', 'ONNXRUNTIME_CPU', 'TARGETS', 'ExportTarget', 'Comparison', 'compare_onnx', 'OUTPUTS',
    'dynamic_axes', 'export_module', 'export_onnx', 'model_kind',
    'traced_input', 'paste_masks', 'fixed_grid_pools', 'runtime_pools', 'Profile', 'profile_onnx', 'TOLERANCE',
    'DetectionMismatch', 'ExportError', 'OnnxRuntimeFailure', 'OutputMismatch', 'UnsupportedDetector', 'first_line',
    'onnx_session', 'relative_difference'
]
