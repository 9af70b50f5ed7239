"""A config whose data is not on this machine: tools/train.py and tools/test.py stop before building anything,
with one message (no traceback) that names the missing path, the expected layout, docs/datasets.md and the
--cfg-options override. Also the path collection itself, through dataset wrappers."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mmengine.config import Config

from mmppma.utils import missing_data

from .conftest import CONFIGS, TOOLS


def run_launcher(args, cwd: Path) -> subprocess.CompletedProcess:
    """A launcher run from ``cwd`` (a directory without data/), as a user would start it."""
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=str(cwd), capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONWARNINGS='ignore'))
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert 'Traceback' not in proc.stderr, proc.stderr[-4000:]
    return proc


def assert_message(stderr: str, paths, layout: str, override: str) -> None:
    assert stderr.startswith('mmppma: the data this config reads is not there:'), stderr
    for path in paths:
        assert f"'{path}' does not exist" in stderr, stderr
    assert layout in stderr and 'docs/datasets.md' in stderr and f'--cfg-options {override}' in stderr, stderr


@pytest.mark.slow
def test_train_without_coco(tmp_path):
    proc = run_launcher([TOOLS / 'train.py', CONFIGS / 'mask_rcnn_ppma_b_1x_coco.py'], tmp_path)
    assert_message(proc.stderr, ['data/coco/'], 'COCO 2017 layout',
                   'train_dataloader.dataset.data_root=/path/to/data val_dataloader.dataset.data_root=')
    assert 'data/coco/annotations/instances_train2017.json' in proc.stderr  # the expected layout
    assert not (tmp_path / 'work_dirs').exists()  # stopped before the runner made its work dir


@pytest.mark.slow
def test_test_without_ade20k(tmp_path):
    proc = run_launcher([TOOLS / 'test.py', CONFIGS / 'upernet_ppma_t_512x512_160k_ade20k.py', 'nowhere.pth'],
                        tmp_path)
    assert_message(proc.stderr, ['data/ade/ADEChallengeData2016'], 'ADE20K (ADEChallengeData2016) layout',
                   'test_dataloader.dataset.data_root=/path/to/data')


@pytest.mark.slow
def test_train_with_a_missing_annotation_file(tmp_path):
    """The data root exists but the annotation file the config names does not (ImageNet with meta/train.txt)."""
    root = tmp_path / 'imagenet'
    (root / 'train').mkdir(parents=True)
    overrides = [f'train_dataloader.dataset.data_root={root}', 'train_dataloader.dataset.ann_file=meta/train.txt',
                 'val_cfg=None']
    proc = run_launcher([TOOLS / 'train.py', CONFIGS / 'ppma_t_8xb128_in1k.py', '--cfg-options', *overrides], tmp_path)
    assert_message(proc.stderr, [f'{root}/meta/train.txt'], 'ImageNet-1K layout',
                   'train_dataloader.dataset.data_root=/path/to/data')
    assert 'val_dataloader' not in proc.stderr  # no validation loop, so its data is not needed


def test_missing_data_looks_through_wrappers(tmp_path):
    (tmp_path / 'ade' / 'images').mkdir(parents=True)
    cfg = Config(dict(
        train_dataloader=dict(dataset=dict(type='RepeatDataset', times=2, dataset=dict(
            type='CocoDataset', data_root=str(tmp_path / 'coco'), ann_file='annotations/train.json',
            data_prefix=dict(img='train/')))),
        val_dataloader=dict(dataset=dict(type='ConcatDataset', datasets=[
            dict(type='ADE20KDataset', data_root=str(tmp_path / 'ade'),
                 data_prefix=dict(img_path='images', seg_map_path='annotations')),
            dict(type='ImageNet', data_root=str(tmp_path / 'imagenet'), split='val'),
            dict(type='ImageNet', data_root='s3://bucket/imagenet', split='val')])),  # remote: not checked
        val_evaluator=dict(type='CocoMetric', ann_file=str(tmp_path / 'ann' / 'val.json')),
        test_dataloader=None))
    got = missing_data(cfg, ['train_dataloader', 'val_dataloader', 'test_dataloader'])
    assert got == [
        ('train_dataloader.dataset.dataset', 'CocoDataset', 'data_root', str(tmp_path / 'coco')),
        ('val_dataloader.dataset.datasets.0', 'ADE20KDataset', 'data_prefix.seg_map_path',
         str(tmp_path / 'ade' / 'annotations')),
        ('val_dataloader.dataset.datasets.1', 'ImageNet', 'data_root', str(tmp_path / 'imagenet')),
        ('val_evaluator', 'ADE20KDataset', 'ann_file', str(tmp_path / 'ann' / 'val.json')),
    ]
    (tmp_path / 'imagenet' / 'val').mkdir(parents=True)
    assert ('val_dataloader.dataset.datasets.1', 'ImageNet', 'data_root', str(tmp_path / 'imagenet')) not in \
        missing_data(cfg, ['val_dataloader'])
