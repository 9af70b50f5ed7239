"""The 3D polyline path mask: dense (:func:`polyline_mask_3d`, in :mod:`.reference`) and applied without forming
it (:func:`polyline_mask_matvec_3d`: a depth scan, then Algorithm 1's column and row scans), dispatched
(:mod:`mmppma.ops.plan`) to :mod:`.reference` (dense), :mod:`.torch_impl` or :mod:`.triton_impl`."""
import torch

from ..checks import check_matvec_3d
from ..devices import triton_available
from ..plan import Op, run
from ..scan import DEFAULT_CHUNK
from . import reference, torch_impl
from .reference import polyline_mask_3d

if triton_available():  # the Triton paths import triton
    from . import triton_impl
else:  # no implementation resolves to 'triton' (plan.resolve_impl)
    triton_impl = None

__all__ = ['polyline_mask_3d', 'polyline_mask_matvec_3d']


POLYLINE_MASK_MATVEC_3D = Op('polyline_mask_matvec_3d', check_matvec_3d, reference, torch_impl, triton_impl)


def polyline_mask_matvec_3d(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, lc: torch.Tensor, *,
                            impl: str = 'auto', chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """``L3D @ x`` for the 3D polyline path mask (Appendix C.2) without forming it: a depth scan
    (``lc``), then a vertical scan (``lb``), then a horizontal scan (``la``).

    x: (B, heads, D, H, W, C); la, lb, lc: (B, heads, D, H, W). Matches :func:`polyline_mask_3d`.
    """
    return run(POLYLINE_MASK_MATVEC_3D, (chunk, ), impl, x, la, lb, lc)
