"""The 3D polyline path mask: dense (:func:`polyline_mask_3d`, in :mod:`.reference`) and applied without forming
it (:func:`polyline_mask_matvec_3d`: a depth scan, then Algorithm 1's column and row scans)."""
import torch

from ..dispatch import resolve_impl
from ..scan import DEFAULT_CHUNK, decay_scan_1d, scan_columns
from .reference import polyline_mask_3d

__all__ = ['polyline_mask_3d', 'polyline_mask_matvec_3d']


def polyline_mask_matvec_3d(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, lc: torch.Tensor, *,
                            impl: str = 'auto', chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """``L3D @ x`` for the 3D polyline path mask (Appendix C.2) without forming it: a depth scan
    (``lc``), then a vertical scan (``lb``), then a horizontal scan (``la``).

    x: (B, heads, D, H, W, C); la, lb, lc: (B, heads, D, H, W). Matches :func:`polyline_mask_3d`.
    """
    if not (la.dim() == 5 and la.shape == lb.shape == lc.shape and x.dim() == 6 and x.shape[:-1] == la.shape):
        raise ValueError('expected x (B, heads, D, H, W, C) and la, lb, lc (B, heads, D, H, W); got '
                         f'x {tuple(x.shape)}, la {tuple(la.shape)}, lb {tuple(lb.shape)}, lc {tuple(lc.shape)}')
    for name, t in (('la', la), ('lb', lb), ('lc', lc)):
        if not t.is_floating_point() or t.is_complex():
            raise ValueError(f'{name}: log-decays must be real floating point tensors; got {t.dtype}')
    requested, impl = impl, resolve_impl(impl, 'polyline_mask_matvec_3d', (x, la, lb, lc))
    if impl == 'triton':
        from ..triton_support.preflight import run_or_fall_back
        return run_or_fall_back('polyline_mask_matvec_3d', lambda *t: _matvec_3d(*t, 'triton', chunk),
                                (x, la, lb, lc), requested, lambda *t: _matvec_3d(*t, 'torch', chunk))
    return _matvec_3d(x, la, lb, lc, impl, chunk)


def _matvec_3d(x, la, lb, lc, impl: str, chunk: int) -> torch.Tensor:
    """:func:`polyline_mask_matvec_3d` with a resolved ``impl``."""
    if impl == 'reference':
        lmask = polyline_mask_3d(la, lb, lc, space='linear')
        flat = x.to(lmask.dtype).reshape(*x.shape[:2], -1, x.shape[-1])
        return (lmask @ flat).reshape(x.shape).to(x.dtype)
    y = decay_scan_1d(x.movedim(2, 4), lc.movedim(2, 4), impl=impl, chunk=chunk).movedim(4, 2)  # along D
    return decay_scan_1d(scan_columns(y, lb, impl, chunk), la, impl=impl, chunk=chunk)  # along H, then W
