"""The base of :mod:`mmppma.deploy`: the onnxruntime session, the errors of export and check, and the measures
the checks report (:func:`relative_difference`, :func:`first_line`). Imports nothing of mmppma."""
from typing import Optional

import torch

#: largest relative difference (:func:`relative_difference`) that counts as the same output
TOLERANCE = 1e-4


class ExportError(RuntimeError):
    """The exporter could not translate the model; ``op`` names the operator it stopped at (None if the
    exporter's message names none)."""

    def __init__(self, message: str, op: Optional[str] = None) -> None:
        super().__init__(message)
        self.op = op


class OnnxRuntimeFailure(RuntimeError):
    """onnxruntime could not load or run the exported file."""


class OutputMismatch(RuntimeError):
    """The ONNX file's outputs are not torch's in number or shape."""


class UnsupportedDetector(ValueError):
    """The detector is not one the whole-detector export covers (the message says which part)."""


class DetectionMismatch(RuntimeError):
    """The ONNX file's detections do not match ``model.predict``'s."""


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's message, after its type's name."""
    line = next((line.strip() for line in str(err).splitlines() if line.strip()), '')
    return f'{type(err).__name__}: {line}' if line else type(err).__name__


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max |got - want| / max |want|``: the largest deviation relative to the output's scale (an
    element-wise ratio would divide by outputs near zero)."""
    scale = want.abs().max().clamp_min(torch.finfo(want.dtype).tiny)
    return float((got - want).abs().max() / scale)


def onnx_session(path: str, threads: Optional[int] = None, profile: Optional[str] = None):
    """An onnxruntime ``InferenceSession`` of the file on CPU, logging fatal errors only (a failed run is raised,
    and reported once, by the caller); ``threads``: its intra-op threads (one inter-op thread); ``profile``: with
    onnxruntime's profiler on, writing to a file of this prefix (``end_profiling()`` names it). Raises
    :class:`OnnxRuntimeFailure` when onnxruntime cannot load the file."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return onnxruntime.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    except Exception as err:  # onnxruntime's own exception types, all reported alike
        raise OnnxRuntimeFailure(f'could not load {path}: {first_line(err)}') from err
