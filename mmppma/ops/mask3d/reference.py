"""The 3D polyline path mask (paper Appendix C.2), dense: :func:`polyline_mask_3d`, the public dense op and the
reference path of :func:`~mmppma.ops.polyline_mask_matvec_3d`."""
import torch

from ..checks import check_choice, table_dtype
from ..masks import segment_sum


def polyline_mask_3d(la: torch.Tensor, lb: torch.Tensor, lc: torch.Tensor, *, space: str = 'log') -> torch.Tensor:
    """Dense 3D polyline path mask (paper Appendix C.2, Eq. 40), (B, heads, N, N) with N = D*H*W.

    la (along W), lb (along H), lc (along D): (B, heads, D, H, W). Token (i, j, k) = (depth, row, column),
    raster order ``p = (i*H + j)*W + k``. The path from query (i, j, k) to key (l, m, n) runs along the
    query's row to column n, then along column n (at depth i) to row m, then along depth to l.
    """
    check_choice('space', space, ('log', 'linear'))
    if la.dim() != 5 or la.shape != lb.shape or la.shape != lc.shape:
        raise ValueError('la, lb, lc: expected three log-decay tensors of shape (B, heads, D, H, W); got '
                         f'{tuple(la.shape)}, {tuple(lb.shape)}, {tuple(lc.shape)}')
    dtype = table_dtype(la, lb, lc)
    sa = segment_sum(la.to(dtype).cumsum(-1))  # [i, j, k, n]
    sb = segment_sum(lb.to(dtype).cumsum(-2).transpose(-1, -2))  # [i, n, j, m]
    sc = segment_sum(lc.to(dtype).cumsum(-3).permute(0, 1, 3, 4, 2))  # [m, n, i, l]
    bsz, heads, d, h, w = la.shape
    # M[i, j, k, l, m, n] = sa[i, j, k, n] + sb[i, n, j, m] + sc[m, n, i, l]
    m = (sa[:, :, :, :, :, None, None, :]
         + sb.permute(0, 1, 2, 4, 5, 3)[:, :, :, :, None, None, :, :]
         + sc.permute(0, 1, 4, 5, 2, 3)[:, :, :, None, None, :, :, :])
    m = m.reshape(bsz, heads, d * h * w, d * h * w)
    return m if space == 'log' else m.exp()


def matvec_3d_reference(x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, lc: torch.Tensor) -> torch.Tensor:
    """``L3D @ x`` with the dense mask; x (B, heads, D, H, W, C)."""
    lmask = polyline_mask_3d(la, lb, lc, space='linear')
    flat = x.to(lmask.dtype).reshape(*x.shape[:2], -1, x.shape[-1])
    return (lmask @ flat).reshape(x.shape).to(x.dtype)


def polyline_mask_matvec_3d_plan(x, la, lb, lc, chunk: int):
    """The reference path of :func:`~mmppma.ops.polyline_mask_matvec_3d` (:class:`~mmppma.ops.plan.Op`)."""
    return matvec_3d_reference
