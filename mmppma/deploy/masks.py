"""Instance masks at RoI resolution pasted into the image: :func:`paste_masks`, in numpy and in torch.

A Mask R-CNN file (:mod:`mmppma.deploy.mask_rcnn`) gives each detection's mask probabilities on the mask
head's M x M grid over its box (``mask_probs``); :func:`paste_masks` resamples them into an image as mmdet's
``_do_paste_mask`` does (``skip_empty=False``): pixel centres mapped into the box, bilinear sampling of the
M x M grid with ``align_corners=False``, zero outside it. Imports nothing of mmppma or mmdet.
"""
from typing import Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

Array = Union[np.ndarray, torch.Tensor]


def _grid(centres, start, end):
    """The normalized sampling coordinates (N, P) of the pixel ``centres`` (P,) in the intervals
    [start, end) (N, 1), as mmdet computes them: ``(p - start) / (end - start) * 2 - 1``, an infinite one (an
    empty interval) set to 0. numpy or torch alike."""
    grid = (centres - start) / (end - start) * 2 - 1
    infinite = abs(grid) == float('inf')
    if isinstance(grid, torch.Tensor):
        return torch.where(infinite, torch.zeros_like(grid), grid)
    return np.where(infinite, np.float32(0), grid)


def _bilinear_weights(grid: np.ndarray, cells: int) -> np.ndarray:
    """(N, P, cells): the weight of each of ``cells`` grid cells in the bilinear sample at each normalized
    coordinate of ``grid`` (N, P), as ``grid_sample(align_corners=False, padding_mode='zeros')``: the
    coordinate unnormalized to ``((g + 1) * cells - 1) / 2``, the two cells around it weighted by distance,
    a cell outside the grid contributing 0."""
    at = ((grid + 1) * cells - 1) / 2
    low = np.floor(at)
    frac = (at - low).astype(np.float32)
    low = low.astype(np.int64)
    cell = np.arange(cells)
    return ((cell == low[..., None]) * (1 - frac)[..., None] + (cell == low[..., None] + 1) * frac[..., None]
            ).astype(np.float32)


def _paste_numpy(probs: np.ndarray, boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    x0, y0, x1, y1 = (boxes[:, i:i + 1].astype(np.float32) for i in range(4))
    with np.errstate(divide='ignore', invalid='ignore'):  # an empty box: mmdet's 0 (:func:`_grid`)
        rows = _bilinear_weights(_grid(np.arange(height, dtype=np.float32) + 0.5, y0, y1), probs.shape[1])  # (N, H, M)
        cols = _bilinear_weights(_grid(np.arange(width, dtype=np.float32) + 0.5, x0, x1), probs.shape[2])  # (N, W, M)
    return rows @ probs.astype(np.float32) @ cols.transpose(0, 2, 1)  # bilinear sampling is separable


def _paste_torch(probs: torch.Tensor, boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    x0, y0, x1, y1 = boxes.float().split(1, dim=1)
    centres = [torch.arange(size, device=boxes.device, dtype=torch.float32) + 0.5 for size in (height, width)]
    ys, xs = _grid(centres[0], y0, y1), _grid(centres[1], x0, x1)
    n = probs.shape[0]
    grid = torch.stack([xs[:, None, :].expand(n, height, width), ys[:, :, None].expand(n, height, width)], dim=3)
    return F.grid_sample(probs[:, None].float(), grid, align_corners=False)[:, 0]


def paste_masks(mask_probs: Array, boxes: Array, height: int, width: int,
                threshold: Optional[float] = None) -> Array:
    """Masks on an M x M grid over their boxes, pasted into an image of ``height`` x ``width``.

    ``mask_probs``: (N, M, M) probabilities (a Mask R-CNN file's ``mask_probs`` for one image, its first
    ``num_dets`` rows); ``boxes``: (N, 4) x1, y1, x2, y2 in the image's pixels (the file's ``boxes``). Returns
    (N, height, width) float32 probabilities, or with ``threshold`` (``test_cfg.rcnn.mask_thr_binary``, 0.5
    in the shipped configs) bool masks ``probs >= threshold``, as mmdet's ``FCNMaskHead`` binarizes them.
    numpy arrays in give numpy arrays out (no torch needed by the computation); torch tensors give torch
    tensors, on their device.

    The pixel at row i, column j samples the grid bilinearly (``align_corners=False``, zero outside the grid)
    at ``((j + 0.5 - x1) / (x2 - x1), (i + 0.5 - y1) / (y2 - y1))`` of the box, as mmdet's
    ``_do_paste_mask`` (``skip_empty=False``); mmdet on a CPU pastes only within a pixel of the boxes, which
    gives the same masks at a threshold of 0.5 (farther out the value stays below 0.5). The numpy form computes
    the same samples as two products with each box's interpolation weights (bilinear sampling is
    separable), equal to the torch form up to float32 rounding.
    """
    if len(mask_probs.shape) != 3 or mask_probs.shape[1] != mask_probs.shape[2]:
        raise ValueError(f'paste_masks: mask_probs must be (N, M, M); got shape {tuple(mask_probs.shape)}')
    if tuple(boxes.shape) != (mask_probs.shape[0], 4):
        raise ValueError(f'paste_masks: boxes must be (N, 4) for {mask_probs.shape[0]} masks; got shape '
                         f'{tuple(boxes.shape)}')
    if isinstance(mask_probs, torch.Tensor) != isinstance(boxes, torch.Tensor):
        raise TypeError('paste_masks: mask_probs and boxes must both be numpy arrays or both torch tensors')
    if isinstance(mask_probs, torch.Tensor):
        pasted = _paste_torch(mask_probs, boxes, height, width)
    else:
        pasted = _paste_numpy(np.asarray(mask_probs), np.asarray(boxes), height, width)
    return pasted if threshold is None else pasted >= threshold
