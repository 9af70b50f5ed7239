"""What a runtime decides about an exported graph (:class:`ExportTarget`), and the export in progress.

While a model is exported (:func:`exporting`: inside :func:`export_mode`, or while ``torch.export`` traces, as
``torch.onnx.export(..., dynamo=True)`` does) every op and layer runs plain PyTorch that an exporter can
translate: ``'auto'`` and ``'triton'`` resolve to ``'torch'`` (a Triton kernel is opaque to a graph), and the
torch paths take their export branches: no ``torch.library`` op, custom autograd Function, in-place inference
shortcut or Python loop over blocks of the input; the softmax attentions loop over image rows and columns as
scans (:func:`~mmppma.ops.torch_support.scan_slices`) where the target says so (:func:`export_target`), which the
exporter keeps as ONNX ``Scan``s. The targets themselves live with the deployment code
(:mod:`mmppma.deploy.targets`).
"""
import contextlib
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional

import torch

#: the ops whose export form a target chooses: a loop over image rows and columns (ONNX ``Scan``) or one-shot maps
LOOP_OPS = ('whole', 'criss_cross')


@dataclass(frozen=True)
class ExportTarget:
    """A runtime an exported file is made for.

    ``name``: what the target is called in messages; ``opset``: the ONNX opset of the file (None: the exporter's
    default); ``loop_tokens``: per
    op of :data:`LOOP_OPS`, the map size in tokens above which a fixed-size export loops over image rows and
    columns (below it, the one-shot maps). An op without an entry loops only in a dynamic export (a file that
    serves every size loops always)."""
    name: str
    opset: Optional[int] = None
    loop_tokens: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self):
        unknown = sorted(set(self.loop_tokens) - set(LOOP_OPS))
        if unknown:
            raise ValueError(f'ExportTarget {self.name!r}: loop_tokens has no op {unknown}; the ops are {LOOP_OPS}')
        if self.opset is not None and (not isinstance(self.opset, int) or self.opset < 1):
            raise ValueError(f'ExportTarget {self.name!r}: opset must be a positive int or None; got {self.opset!r}')

    def loops(self, op: str, tokens) -> bool:
        """Whether ``op``'s export form loops on maps of ``tokens`` (an int, or a traced size: dynamic)."""
        if op not in LOOP_OPS:
            raise ValueError(f'ExportTarget.loops: op must be one of {LOOP_OPS}; got {op!r}')
        threshold = self.loop_tokens.get(op)
        return not isinstance(tokens, int) or (threshold is not None and tokens > threshold)


# a plain global, not a ContextVar: dynamo reads (and guards on) a global, but cannot trace ContextVar.get
_EXPORT_TARGET: Optional[ExportTarget] = None  # inside export_mode: its target
_PLAIN_TARGET = ExportTarget('plain')  # no runtime's choices: the ops loop only in a dynamic export


@contextlib.contextmanager
def export_mode(target: Optional[ExportTarget] = None) -> Iterator[None]:
    """Run mmppma's ops and layers as plain PyTorch inside this context (see the module docstring), their export
    forms chosen for ``target`` (:class:`~mmppma.ops.export.ExportTarget`; None: no runtime's choices, the
    ops loop only in a dynamic export); for exporters, and for checking the export paths in eager mode."""
    global _EXPORT_TARGET
    if target is not None and not isinstance(target, ExportTarget):
        raise TypeError(f'export_mode: target must be an ExportTarget (mmppma.deploy.targets) or None; got {target!r}')
    before, _EXPORT_TARGET = _EXPORT_TARGET, target or _PLAIN_TARGET
    try:
        yield
    finally:
        _EXPORT_TARGET = before


def exporting() -> bool:
    """Whether the ops and layers take their plain PyTorch paths: inside :func:`export_mode`, or while
    ``torch.export`` traces."""
    return _EXPORT_TARGET is not None or torch.compiler.is_exporting()


def export_target() -> ExportTarget:
    """The target of the export in progress (:func:`export_mode`'s; a ``torch.export`` trace outside it: none of
    a runtime's choices)."""
    return _EXPORT_TARGET or _PLAIN_TARGET
