"""The runtimes an exported file is made for, as :class:`~mmppma.ops.export.ExportTarget` s: what each
decides about the graph (opset, where the attention ops loop). ``ONNXRUNTIME_CPU`` is the one the tools export for.

The loop thresholds are the map sizes where onnxruntime on a CPU runs the looped form faster than the one-shot maps
(fixed-size files; a dynamic file loops always):

* whole attention, 8 heads: 1.4 ms looped against 2.6 one-shot at 14 x 14, the same at 24 x 24, 53 against 28 at
  32 x 32: above 576 tokens it loops;
* criss-cross attention, 4 heads: 6.4 ms against 11.4 at 56 x 56, 99 against 85 at 100 x 168, 703 against 548 at
  200 x 336: above 8192 tokens it loops.
"""
from mmppma.ops.export import ExportTarget

__all__ = ['ExportTarget', 'ONNXRUNTIME_CPU', 'TARGETS']

ONNXRUNTIME_CPU = ExportTarget('onnxruntime-cpu', opset=18, loop_tokens={'whole': 576, 'criss_cross': 8192})
#: the targets by name
TARGETS = {target.name: target for target in (ONNXRUNTIME_CPU, )}
