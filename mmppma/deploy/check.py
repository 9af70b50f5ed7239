"""The check of an exported file against torch: :func:`compare_onnx` runs the file in onnxruntime on CPU beside the
torch module and reports the largest relative difference per input (a detector is checked against
``model.predict`` instead, :func:`mmppma.deploy.mask_rcnn.compare_with_predict`)."""
from typing import List, NamedTuple, Sequence, Tuple

import torch
import torch.nn as nn

from .runtime import OnnxRuntimeFailure, OutputMismatch, first_line, onnx_session, relative_difference


class Comparison(NamedTuple):
    shape: Tuple[int, ...]
    max_rel_diff: float


def compare_onnx(path: str, module: nn.Module, inputs: Sequence[torch.Tensor]) -> List[Comparison]:
    """Run the ONNX file in onnxruntime (CPU) and ``module`` in torch eager on each input; per input, the
    largest :func:`~mmppma.deploy.runtime.relative_difference` over the outputs. Raises
    :class:`~mmppma.deploy.runtime.OnnxRuntimeFailure` when onnxruntime cannot load the file or run it at an
    input, :class:`~mmppma.deploy.runtime.OutputMismatch` when its outputs differ from torch's in number or
    shape."""
    session = onnx_session(path)
    name = session.get_inputs()[0].name
    results = []
    for x in inputs:
        try:
            got = session.run(None, {name: x.numpy()})
        except Exception as err:  # onnxruntime's own exception types, all reported alike
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
