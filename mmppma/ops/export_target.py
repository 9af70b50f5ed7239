"""What a runtime decides about an exported graph: :class:`ExportTarget`. The ops read the target of the export
in progress (:func:`mmppma.ops.export_target`); the targets themselves live with the deployment code
(:mod:`mmppma.deploy.targets`)."""
from dataclasses import dataclass, field
from typing import Mapping, Optional

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
