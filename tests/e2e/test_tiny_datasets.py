"""tools/make_tiny_datasets.py: deterministic, well-formed COCO / ADE20K / ImageNet-layout sets."""
import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from .conftest import make_data


def digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob('*')) if p.is_file()}


def test_same_seed_same_bytes_other_seed_other_images_one_task_alone_the_same(tmp_path):
    counts = dict(coco=(3, 2), ade=(2, 2), imagenet=(1, 1))
    for name, seed, tasks in (('a', 0, counts), ('b', 0, counts), ('c', 1, counts), ('coco', 0, ['coco'])):
        assert make_data(tmp_path / name, counts, seed=seed, tasks=list(tasks)).returncode == 0
    a, b, c = (digest(tmp_path / n) for n in 'abc')
    assert a == b and len(a) == 3 + 2 + 2 + 2 * 2 + 2 * 2 + 4 * 2 + 3  # images, labels, jsons, metas, classes
    assert a.keys() == c.keys()
    assert a['coco/annotations/instances_train.json'] != c['coco/annotations/instances_train.json']
    assert digest(tmp_path / 'a' / 'coco') == digest(tmp_path / 'coco' / 'coco')  # other tasks change nothing


def test_coco_annotations_match_the_pixels(tiny_data):
    from pycocotools.coco import COCO
    for split, num_images in (('train', 12), ('val', 6)):
        coco = COCO(str(tiny_data / 'coco' / 'annotations' / f'instances_{split}.json'))
        assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == ['circle', 'square', 'triangle']
        assert len(coco.getImgIds()) == num_images
        for img in coco.loadImgs(coco.getImgIds()):
            pixels = cv2.imread(str(tiny_data / 'coco' / split / img['file_name']))
            assert pixels.shape == (img['height'], img['width'], 3) and 128 <= min(pixels.shape[:2])
            anns = coco.loadAnns(coco.getAnnIds(imgIds=img['id']))
            assert 1 <= len(anns) <= 4
            for ann in anns:
                mask = coco.annToMask(ann)
                x, y, w, h = ann['bbox']
                ys, xs = np.nonzero(mask)
                assert ann['iscrowd'] == 0 and ann['category_id'] in (1, 2, 3)
                assert abs(xs.min() - x) <= 1.5 and abs(ys.min() - y) <= 1.5
                assert abs(xs.max() + 1 - (x + w)) <= 1.5 and abs(ys.max() + 1 - (y + h)) <= 1.5
                assert mask.sum() == pytest.approx(ann['area'], rel=0.1)
                # the object is drawn in its class color (BGR): the class is visible
                color = pixels[mask.astype(bool)].mean(0)
                assert np.argmax(color) == {1: 2, 2: 1, 3: 0}[ann['category_id']]


def test_ade_layout_and_labels(tiny_data):
    root = tiny_data / 'ade'
    for sub, num in (('training', 8), ('validation', 4)):
        images = sorted((root / 'images' / sub).glob('*.jpg'))
        labels = sorted((root / 'annotations' / sub).glob('*.png'))
        assert len(images) == num and [p.stem for p in images] == [p.stem for p in labels]
        seen = set()
        for img, lab in zip(images, labels):
            label = cv2.imread(str(lab), cv2.IMREAD_UNCHANGED)
            assert label.dtype == np.uint8 and label.shape == cv2.imread(str(img)).shape[:2]
            seen |= set(np.unique(label).tolist())
        assert seen <= {0, 1, 2, 3, 4} and 1 in seen and seen & {2, 3, 4}


def test_imagenet_layout_and_meta(tiny_data):
    root = tiny_data / 'imagenet'
    classes = (root / 'classes.txt').read_text().split()
    assert classes == ['circle', 'square', 'triangle', 'ring']
    for split, per_class in (('train', 4), ('val', 2)):
        lines = (root / 'meta' / f'{split}.txt').read_text().splitlines()
        assert len(lines) == 4 * per_class
        for line in lines:
            path, label = line.split()
            assert path.split('/')[0] == classes[int(label)] and (root / split / path).is_file()
        assert sorted(p.name for p in (root / split).iterdir()) == sorted(classes)


def test_bad_count_is_a_clear_error(tmp_path):
    proc = make_data(tmp_path, dict(coco=(0, 1)), tasks=('coco', ))
    assert proc.returncode == 1 and 'coco train: the count must be >= 1' in proc.stderr
