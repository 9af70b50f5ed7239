"""The 3D mask-vector product, torch path: a scan along depth, then Algorithm 1's column and row scans
(:func:`matvec_3d`, which the Triton path runs on its scans)."""
import functools
from typing import Callable

import torch

from ..scan.torch_impl import scan_columns, scan_torch


def matvec_3d(scan: Callable[..., torch.Tensor], x: torch.Tensor, la: torch.Tensor, lb: torch.Tensor,
              lc: torch.Tensor) -> torch.Tensor:
    """``L3D @ x`` from the 1D ``scan(x, log_decay)``: along D (``lc``), then H (``lb``), then W (``la``)."""
    y = scan(x.movedim(2, 4), lc.movedim(2, 4)).movedim(4, 2)  # along D
    return scan(scan_columns(scan, y, lb), la)  # along H, then W


def polyline_mask_matvec_3d_plan(x, la, lb, lc, chunk: int):
    """The torch path of :func:`~mmppma.ops.polyline_mask_matvec_3d` (:class:`~mmppma.ops.plan.Op`)."""
    return functools.partial(matvec_3d, functools.partial(scan_torch, chunk=chunk))
