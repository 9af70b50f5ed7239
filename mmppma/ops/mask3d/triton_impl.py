"""The 3D mask-vector product, Triton path: :func:`~mmppma.ops.mask3d.torch_impl.matvec_3d` on the scan kernel
(:mod:`mmppma.ops.scan.triton_impl`)."""
import functools
from typing import Optional

from ..scan.triton_impl import decay_scan_triton
from ..triton_support.calls import Caller
from .torch_impl import matvec_3d


def polyline_mask_matvec_3d_plan(x, la, lb, lc, chunk: int, traced: Optional[bool]):
    """The Triton path of :func:`~mmppma.ops.polyline_mask_matvec_3d` (:class:`~mmppma.ops.plan.Op`)."""
    scan = functools.partial(decay_scan_triton, caller=Caller.of('polyline_mask_matvec_3d', x), traced=traced)
    return functools.partial(matvec_3d, scan)
