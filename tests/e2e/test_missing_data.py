"""Data not on this machine: tools/train.py and test.py stop at once with one message naming the missing path, the
layout, docs/datasets.md and the --cfg-options override; the path collection through dataset wrappers."""
import os

import pytest
from mmengine.config import Config

from mmppma.utils import missing_data

from .conftest import CONFIGS, TOOLS, run

# case -> (launcher, config, its --cfg-options, the missing paths, the layout named, the override named)
CASES = {
    'train-without-coco': ('train.py', 'mask_rcnn_ppma_b_1x_coco.py', [], ['data/coco/'], 'COCO 2017 layout',
                           'train_dataloader.dataset.data_root=/path/to/data val_dataloader.dataset.data_root='),
    'test-without-ade20k': ('test.py', 'upernet_ppma_t_512x512_160k_ade20k.py', [], ['data/ade/ADEChallengeData2016'],
                            'ADE20K (ADEChallengeData2016) layout', 'test_dataloader.dataset.data_root=/path/to/data'),
    # the data root exists but the annotation file the config names does not; no validation loop, no val data
    'train-without-annotation-file': ('train.py', 'ppma_t_8xb128_in1k.py', [
        'train_dataloader.dataset.data_root={root}', 'train_dataloader.dataset.ann_file=meta/train.txt',
        'val_cfg=None'], ['{root}/meta/train.txt'], 'ImageNet-1K layout',
        'train_dataloader.dataset.data_root=/path/to/data'),
}


@pytest.mark.slow
@pytest.mark.parametrize('case', CASES)
def test_launcher_names_the_missing_data(case, tmp_path):
    """Run from a directory without data/, as a user would start it."""
    tool, config, options, paths, layout, override = CASES[case]
    root = tmp_path / 'imagenet'
    (root / 'train').mkdir(parents=True)
    args = [TOOLS / tool, CONFIGS / config, *(['nowhere.pth'] if tool == 'test.py' else [])]
    args += ['--cfg-options', *(o.format(root=root) for o in options)] if options else []
    proc = run(args, dict(os.environ, PYTHONWARNINGS='ignore'), check=False, cwd=tmp_path)
    assert proc.returncode != 0 and 'Traceback' not in proc.stderr, proc.stderr[-4000:]
    assert proc.stderr.startswith('mmppma: the data this config reads is not there:'), proc.stderr
    for path in paths:
        assert f"'{path.format(root=root)}' does not exist" in proc.stderr, proc.stderr
    assert layout in proc.stderr and 'docs/datasets.md' in proc.stderr and f'--cfg-options {override}' in proc.stderr
    if case == 'train-without-coco':
        assert 'data/coco/annotations/instances_train2017.json' in proc.stderr  # the expected layout
        assert not (tmp_path / 'work_dirs').exists()  # stopped before the runner made its work dir
    if case == 'train-without-annotation-file':
        assert 'val_dataloader' not in proc.stderr


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
