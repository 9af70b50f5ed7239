#!/usr/bin/env python
"""Generate tiny, learnable, deterministic stand-ins for COCO, ADE20K and ImageNet (nothing binary is committed).

    python tools/make_tiny_datasets.py [--out data/tiny] [--seed 0] [--tasks coco ade imagenet]
                                       [--coco-train 240 --coco-val 48 --ade-train 120 --ade-val 24
                                        --imagenet-train 40 --imagenet-val 10]

Every image is a noisy background with shapes whose class is visible (shape and color): filled circles,
squares and triangles. The same seed gives byte-identical files. Layout under ``--out``::

    coco/annotations/instances_{train,val}.json   COCO instances: bbox (xywh), area, iscrowd=0,
    coco/{train,val}/*.jpg                        segmentation polygons, categories 1..3
    ade/images/{training,validation}/*.jpg        ADE20K layout; label PNGs with ADE's reduce_zero_label
    ade/annotations/{training,validation}/*.png   semantics: 0 = unlabeled (ignored), 1 = wall (the
                                                  background), 2..4 = circle, square, triangle
    imagenet/{train,val}/<class>/*.JPEG           ImageNet folder layout (one folder per class), and
    imagenet/meta/{train,val}.txt                 mmpretrain annotation lists ("<class>/<file> <label>")
    imagenet/classes.txt                          class names in label order

The configs under ``configs/tiny/`` read these (root: ``$MMPPMA_TINY_DATA``, default ``data/tiny``).
"""
import argparse
import json
import math
import os
import os.path as osp
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np

#: Object classes shared by all three sets: (name, BGR fill color). Colors differ per class, so a class
#: is recognisable from color alone early in training and from shape later.
SHAPES = (('circle', (40, 40, 220)), ('square', (40, 190, 40)), ('triangle', (220, 90, 30)))
COCO_CLASSES = tuple(name for name, _ in SHAPES)
ADE_CLASSES = ('wall', ) + COCO_CLASSES  # label PNG values 1..4; 0 = unlabeled
IMAGENET_CLASSES = COCO_CLASSES + ('ring', )
RING_COLOR = (30, 200, 220)

# Each task draws from its own generator, derived from --seed, so changing one task's counts never changes
# another task's files.
TASK_SEED_OFFSETS = {'coco': 1, 'ade': 2, 'imagenet': 3}
SPLIT_SEED_OFFSETS = {'train': 0, 'val': 1000}
JPEG_QUALITY = 95


def noisy_background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth random color gradient plus pixel noise, uint8 (H, W, 3) BGR."""
    corners = rng.uniform(70, 185, size=(2, 2, 3)).astype(np.float32)
    base = cv2.resize(corners, (width, height), interpolation=cv2.INTER_LINEAR)
    noise = rng.normal(0, 18, size=(height, width, 3)).astype(np.float32)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def shape_polygon(kind: str, cx: float, cy: float, size: float, angle: float) -> np.ndarray:
    """Vertices (K, 2) as float (x, y) of a shape of diameter ``size`` centred at (cx, cy)."""
    r = size / 2
    if kind in ('circle', 'ring'):
        t = np.linspace(0, 2 * math.pi, 24, endpoint=False)
    elif kind == 'square':
        t = np.linspace(0, 2 * math.pi, 4, endpoint=False) + angle
        r = r * math.sqrt(2) / 1.2  # keep the square about as large as the circle
    elif kind == 'triangle':
        t = np.linspace(0, 2 * math.pi, 3, endpoint=False) + angle
    else:
        raise ValueError(f'unknown shape {kind!r}')
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=1)


def jitter_color(rng: np.random.Generator, color: Sequence[int], amount: int = 25) -> Tuple[int, int, int]:
    return tuple(int(np.clip(c + rng.integers(-amount, amount + 1), 0, 255)) for c in color)


def fill(img: np.ndarray, poly: np.ndarray, color) -> None:
    cv2.fillPoly(img, [np.round(poly).astype(np.int32)], color, lineType=cv2.LINE_8)


def polygon_area(poly: np.ndarray) -> float:
    x, y = poly[:, 0], poly[:, 1]
    return float(0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def place_shapes(rng: np.random.Generator, height: int, width: int, count: int, min_size: int,
                 max_size: int) -> List[Tuple[str, np.ndarray]]:
    """Up to ``count`` non-overlapping shapes fully inside the image: [(class name, polygon)]."""
    placed: List[Tuple[str, np.ndarray]] = []
    boxes: List[Tuple[float, float, float, float]] = []
    for _ in range(count * 20):
        if len(placed) == count:
            break
        kind = COCO_CLASSES[rng.integers(len(COCO_CLASSES))]
        size = float(rng.uniform(min_size, max_size))
        cx = float(rng.uniform(size / 2 + 2, width - size / 2 - 2))
        cy = float(rng.uniform(size / 2 + 2, height - size / 2 - 2))
        poly = shape_polygon(kind, cx, cy, size, float(rng.uniform(0, math.pi / 2)))
        x0, y0 = poly.min(0)
        x1, y1 = poly.max(0)
        if x0 < 0 or y0 < 0 or x1 > width - 1 or y1 > height - 1:
            continue
        if any(x0 < bx1 + 3 and bx0 < x1 + 3 and y0 < by1 + 3 and by0 < y1 + 3 for bx0, by0, bx1, by1 in boxes):
            continue
        placed.append((kind, poly))
        boxes.append((x0, y0, x1, y1))
    return placed


def write_jpeg(path: str, img: np.ndarray) -> None:
    if not cv2.imwrite(path, img, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]):
        raise OSError(f'could not write {path}')


def color_of(kind: str) -> Tuple[int, int, int]:
    return dict(SHAPES)[kind] if kind != 'ring' else RING_COLOR


# ---------------------------------------------------------------------------------------------- COCO
def make_coco_split(rng: np.random.Generator, root: str, split: str, num_images: int) -> Dict[str, int]:
    img_dir = osp.join(root, split)
    os.makedirs(img_dir, exist_ok=True)
    images, annotations = [], []
    for idx in range(num_images):
        height, width = (int(v) for v in rng.integers(128, 193, size=2))
        img = noisy_background(rng, height, width)
        shapes = place_shapes(rng, height, width, int(rng.integers(1, 5)), 22, 64)
        image_id = idx + 1
        file_name = f'{split}_{image_id:06d}.jpg'
        for kind, poly in shapes:
            fill(img, poly, jitter_color(rng, color_of(kind)))
            x0, y0 = poly.min(0)
            x1, y1 = poly.max(0)
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=image_id,
                    category_id=COCO_CLASSES.index(kind) + 1,
                    bbox=[round(float(x0), 2), round(float(y0), 2), round(float(x1 - x0), 2),
                          round(float(y1 - y0), 2)],
                    area=round(polygon_area(poly), 2),
                    iscrowd=0,
                    segmentation=[[round(float(v), 2) for v in poly.reshape(-1)]]))
        write_jpeg(osp.join(img_dir, file_name), img)
        images.append(dict(id=image_id, file_name=file_name, height=height, width=width))
    coco = dict(
        info=dict(description=f'mmppma tiny COCO-style shapes ({split})', version='1.0'),
        licenses=[],
        images=images,
        annotations=annotations,
        categories=[dict(id=i + 1, name=name, supercategory='shape') for i, name in enumerate(COCO_CLASSES)])
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    with open(osp.join(root, 'annotations', f'instances_{split}.json'), 'w') as f:
        json.dump(coco, f)
    return dict(images=len(images), annotations=len(annotations))


# ---------------------------------------------------------------------------------------------- ADE20K
def make_ade_split(rng: np.random.Generator, root: str, split: str, num_images: int) -> Dict[str, int]:
    """Label PNG: 1 wall (the background), 2..4 shapes, 0 on a few random clutter blobs (ignored with
    reduce_zero_label, as ADE's unlabeled pixels are)."""
    sub = 'training' if split == 'train' else 'validation'
    img_dir, ann_dir = osp.join(root, 'images', sub), osp.join(root, 'annotations', sub)
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    for idx in range(num_images):
        height, width = (int(v) for v in rng.integers(128, 161, size=2))
        img = noisy_background(rng, height, width)
        label = np.full((height, width), ADE_CLASSES.index('wall') + 1, dtype=np.uint8)
        for _ in range(int(rng.integers(0, 3))):  # unlabeled clutter: gray blobs of any size
            center = (int(rng.integers(0, width)), int(rng.integers(0, height)))
            axes = (int(rng.integers(5, 16)), int(rng.integers(5, 16)))
            gray = int(rng.integers(20, 236))
            cv2.ellipse(img, center, axes, 0, 0, 360, (gray, gray, gray), -1)
            cv2.ellipse(label, center, axes, 0, 0, 360, 0, -1)
        for kind, poly in place_shapes(rng, height, width, int(rng.integers(1, 5)), 20, 56):
            fill(img, poly, jitter_color(rng, color_of(kind)))
            fill(label, poly, ADE_CLASSES.index(kind) + 1)
        name = f'ADE_{sub}_{idx + 1:06d}'
        write_jpeg(osp.join(img_dir, name + '.jpg'), img)
        if not cv2.imwrite(osp.join(ann_dir, name + '.png'), label):
            raise OSError(f'could not write {osp.join(ann_dir, name + ".png")}')
    return dict(images=num_images)


# ---------------------------------------------------------------------------------------------- ImageNet
def make_imagenet_split(rng: np.random.Generator, root: str, split: str, per_class: int) -> Dict[str, int]:
    """One centred shape per 64..80 px image; class = shape (a ring is a circle with a hole)."""
    lines = []
    for label, kind in enumerate(IMAGENET_CLASSES):
        os.makedirs(osp.join(root, split, kind), exist_ok=True)
        for idx in range(per_class):
            size = int(rng.integers(64, 81))
            img = noisy_background(rng, size, size)
            diameter = float(rng.uniform(0.45, 0.8) * size)
            cx, cy = (float(v) for v in rng.uniform(size / 2 - 6, size / 2 + 6, size=2))
            shape = 'circle' if kind == 'ring' else kind
            poly = shape_polygon(shape, cx, cy, diameter, float(rng.uniform(0, math.pi / 2)))
            fill(img, poly, jitter_color(rng, color_of(kind)))
            if kind == 'ring':
                hole = shape_polygon('circle', cx, cy, diameter * 0.5, 0.0)
                fill(img, hole, tuple(int(v) for v in img[int(cy), 0]))
            file_name = f'{kind}/{split}_{kind}_{idx + 1:05d}.JPEG'
            write_jpeg(osp.join(root, split, file_name), img)
            lines.append(f'{file_name} {label}')
    os.makedirs(osp.join(root, 'meta'), exist_ok=True)
    with open(osp.join(root, 'meta', f'{split}.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    with open(osp.join(root, 'classes.txt'), 'w') as f:
        f.write('\n'.join(IMAGENET_CLASSES) + '\n')
    return dict(images=len(lines))


#: (train, val) images; for imagenet, images per class.
DEFAULT_COUNTS = {'coco': (240, 48), 'ade': (120, 24), 'imagenet': (40, 10)}
MAKERS = {'coco': make_coco_split, 'ade': make_ade_split, 'imagenet': make_imagenet_split}


def make_tiny_datasets(out: str,
                       seed: int = 0,
                       tasks: Sequence[str] = ('coco', 'ade', 'imagenet'),
                       counts: Optional[Dict[str, Tuple[int, int]]] = None) -> Dict[str, Dict[str, Dict[str, int]]]:
    """Write the requested sets under ``out``; returns {task: {split: summary}}.

    counts: {task: (train, val)}; for imagenet the numbers are images per class.
    """
    counts = {**DEFAULT_COUNTS, **(counts or {})}
    summary: Dict[str, Dict[str, Dict[str, int]]] = {}
    for task in tasks:
        if task not in MAKERS:
            raise ValueError(f'unknown task {task!r}; choose from {", ".join(MAKERS)}')
        root = osp.join(out, task)
        summary[task] = {}
        for split, num in zip(('train', 'val'), counts[task]):
            if num < 1:
                raise ValueError(f'{task} {split}: the count must be >= 1; got {num}')
            rng = np.random.default_rng([seed, TASK_SEED_OFFSETS[task], SPLIT_SEED_OFFSETS[split]])
            summary[task][split] = MAKERS[task](rng, root, split, num)
    return summary



def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='data/tiny', help='output folder (default: data/tiny)')
    parser.add_argument('--seed', type=int, default=0, help='random seed; the same seed gives identical files')
    parser.add_argument('--tasks', nargs='+', default=list(MAKERS), choices=list(MAKERS), help='sets to make')
    for task, (train, val) in DEFAULT_COUNTS.items():
        unit = ' per class' if task == 'imagenet' else ''
        parser.add_argument(f'--{task}-train', type=int, default=train, help=f'train images{unit} ({train})')
        parser.add_argument(f'--{task}-val', type=int, default=val, help=f'val images{unit} ({val})')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cv2.setNumThreads(1)  # small images: threads only add overhead, and output must not depend on them
    counts = {task: (getattr(args, f'{task}_train'), getattr(args, f'{task}_val')) for task in DEFAULT_COUNTS}
    start = time.time()
    try:
        summary = make_tiny_datasets(args.out, args.seed, args.tasks, counts)
    except (ValueError, OSError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    for task, splits in summary.items():
        parts = ', '.join(f'{split}: ' + ', '.join(f'{v} {k}' for k, v in info.items())
                          for split, info in splits.items())
        print(f'{task:9s} -> {osp.join(args.out, task)} ({parts})')
    print(f'done in {time.time() - start:.1f} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
