"""The runner set-up ``tools/train.py`` and ``tools/test.py`` share, for every OpenMMLab library: arguments, the
config (its ``default_scope``'s modules registered, :func:`~mmppma.utils.configs.register_scope_modules`), the work
dir, CPU distributed runs, the data check and the runner. ``import mmppma`` does not import it.
"""
import argparse
import datetime
import os
import os.path as osp
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
from mmengine.config import Config
from mmengine.logging import print_log

from .configs import load_config, register_scope_modules

__all__ = ['register_scope_modules', 'build_runner', 'setup_work_dir', 'setup_cpu_distributed',
           'finish_distributed', 'set_local_rank', 'launcher_parser', 'parse_launcher_args', 'load_launch_config',
           'missing_data', 'check_data', 'apply_test_amp']


def setup_work_dir(cfg: Config, work_dir: Optional[str], config_path: str) -> None:
    """Work dir priority: command line > config > ``./work_dirs/<config name>``."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])


def setup_cpu_distributed(cfg: Config) -> None:
    """Make a distributed launch work on a machine without CUDA.

    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and its DDP wrapper passes
    ``device_ids=[LOCAL_RANK]``; both fail without CUDA. Here the process group is initialised with the
    gloo backend (the Runner then skips its own ``init_dist``) and DDP gets ``device_ids=None``.
    Does nothing for ``launcher='none'`` or when CUDA is available.
    """
    launcher = cfg.get('launcher', 'none')
    if launcher == 'none' or torch.cuda.is_available():
        return
    env_cfg = cfg.setdefault('env_cfg', {})
    dist_cfg = env_cfg.setdefault('dist_cfg', {})
    if dist_cfg.get('backend', 'nccl') != 'gloo':
        print_log(f"CUDA is not available: using the gloo dist backend instead of "
                  f"'{dist_cfg.get('backend', 'nccl')}'", logger='current')
        dist_cfg['backend'] = 'gloo'
    if launcher != 'pytorch':
        raise RuntimeError(f"--launcher {launcher} needs CUDA (mmengine's init_dist selects a GPU). On a "
                           'CPU-only machine launch with torchrun and --launcher pytorch.')
    wrapper_cfg = cfg.get('model_wrapper_cfg', None)
    if wrapper_cfg is None:
        cfg.model_wrapper_cfg = dict(
            type='MMDistributedDataParallel',
            device_ids=None,
            broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))
    else:
        wrapper_cfg.setdefault('device_ids', None)
    if not torch.distributed.is_initialized():
        kwargs = {k: v for k, v in dist_cfg.items() if k not in ('backend', 'init_backend')}
        if isinstance(kwargs.get('timeout'), (int, float)):
            kwargs['timeout'] = datetime.timedelta(seconds=kwargs['timeout'])
        torch.distributed.init_process_group(backend='gloo', **kwargs)


def finish_distributed() -> None:
    """End a distributed run: every rank waits for the others, then leaves the process group (a process that exits
    with its group alive can abort in the backend's threads at exit). Does nothing outside a distributed run."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def build_runner(cfg: Config):
    """Build the runner the config asks for (``runner_type``) or mmengine's ``Runner``."""
    if 'runner_type' in cfg:
        from mmengine.registry import RUNNERS
        return RUNNERS.build(cfg)
    from mmengine.runner import Runner
    return Runner.from_cfg(cfg)


def apply_test_amp(cfg: Config) -> None:
    """Evaluate under autocast: mmengine's ``TestLoop(fp16=True)``, which runs bfloat16 on CPU (faster there,
    see docs/benchmarks.md) and float16 on CUDA."""
    test_cfg = cfg.get('test_cfg') or {}
    loop = test_cfg.get('type', 'TestLoop')
    if loop != 'TestLoop':
        raise SystemExit(f"--amp sets fp16=True on mmengine's TestLoop, but this config's test_cfg.type is "
                         f"'{loop}'; enable autocast in that loop's config instead.")
    test_cfg['fp16'] = True
    cfg.test_cfg = test_cfg


def set_local_rank(local_rank: int) -> None:
    """Export ``LOCAL_RANK`` for launchers that pass ``--local_rank`` instead of setting it."""
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(local_rank)


def launcher_parser(description: str, work_dir_help: str) -> argparse.ArgumentParser:
    """The arguments tools/train.py and tools/test.py share: CONFIG, --work-dir, --cfg-options, --launcher
    and the --local_rank that older launchers pass. Each tool adds its own before parsing."""
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help=work_dir_help)
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. train_cfg.max_epochs=12 "model.backbone.arch=small"')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    # torch.distributed.launch passes --local-rank (torch >= 2.0) or --local_rank.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    return parser


def parse_launcher_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    set_local_rank(args.local_rank)
    return args


def load_launch_config(args: argparse.Namespace) -> Config:
    """The config with ``--cfg-options`` merged, the launcher set, its scope's modules registered and the
    work dir decided."""
    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    register_scope_modules(cfg.get('default_scope', None))
    setup_work_dir(cfg, args.work_dir, args.config)
    return cfg


# --------------------------------------------------------------------------------------------- data check
#: Dataset type -> (data set, the layout upstream's configs expect, as lines). The README of each library has
#: the download steps; docs/datasets.md has the short version.
DATA_LAYOUTS = {
    'CocoDataset': ('COCO 2017', ['data/coco/annotations/instances_train2017.json', 'data/coco/annotations/'
                                  'instances_val2017.json', 'data/coco/train2017/*.jpg', 'data/coco/val2017/*.jpg']),
    'ADE20KDataset': ('ADE20K (ADEChallengeData2016)', ['data/ade/ADEChallengeData2016/images/{training,validation}/'
                                                        '*.jpg', 'data/ade/ADEChallengeData2016/annotations/'
                                                        '{training,validation}/*.png']),
    'ImageNet': ('ImageNet-1K', ['data/imagenet/train/<class>/*.JPEG', 'data/imagenet/val/<class>/*.JPEG (or '
                                 'val/*.JPEG with meta/val.txt)', 'data/imagenet/meta/{train,val}.txt (optional '
                                 'without ann_file: then the class folders give the labels)']),
}


def _is_local(path: str) -> bool:
    return bool(path) and '://' not in path


def _join(root: str, path: str) -> str:
    """mmengine's rule for dataset paths: relative ones are relative to ``data_root``."""
    return path if not root or osp.isabs(path) else osp.join(root, path)


def _datasets(cfg: dict, key: str) -> Iterator[Tuple[dict, str]]:
    """(dataset config, its dotted key) of every leaf dataset, looking through wrapper datasets
    (``dataset=`` of RepeatDataset, ClassBalancedDataset, ...; ``datasets=`` of ConcatDataset)."""
    if 'datasets' in cfg:
        for i, sub in enumerate(cfg['datasets']):
            yield from _datasets(sub, f'{key}.datasets.{i}')
    elif isinstance(cfg.get('dataset'), dict):
        yield from _datasets(cfg['dataset'], f'{key}.dataset')
    else:
        yield cfg, key


def _dataset_paths(ds: dict) -> List[Tuple[str, str]]:
    """(what, path) of the local paths a dataset config reads: data root, annotation file, data prefixes."""
    root = ds.get('data_root') or ''
    paths = [('data_root', root)] if _is_local(root) else []
    ann_file = ds.get('ann_file') or ''
    if _is_local(ann_file):
        paths.append(('ann_file', _join(root, ann_file)))
    prefix = ds.get('data_prefix') or ''
    prefixes = prefix.items() if isinstance(prefix, dict) else [('', prefix)]
    paths += [(f'data_prefix{"." + k if k else ""}', _join(root, v)) for k, v in prefixes if _is_local(v or '')]
    if not prefix and ds.get('split') and not ann_file and _is_local(root):  # mmpretrain ImageNet(split=...)
        paths.append(('split', osp.join(root, ds['split'])))
    return paths


def _evaluator_ann_files(evaluator) -> List[str]:
    """The local ``ann_file`` of each metric of an evaluator config (e.g. mmdet's CocoMetric)."""
    metrics = evaluator.get('metrics', evaluator) if isinstance(evaluator, dict) else evaluator
    metrics = [metrics] if isinstance(metrics, dict) else list(metrics or [])
    return [m['ann_file'] for m in metrics if isinstance(m, dict) and _is_local(m.get('ann_file') or '')]


def missing_data(cfg: Config, loaders: Sequence[str]) -> List[Tuple[str, str, str, str]]:
    """(config key, dataset type, what, path) of every local data path of ``loaders`` (e.g.
    ``'train_dataloader'``) and of their evaluators' annotation files (``train_evaluator`` ...) that does not
    exist. Loaders the config leaves out (None) are skipped. Of a dataset only the outermost missing path is
    reported (a missing data root, not everything below it)."""
    missing = []
    for loader in loaders:
        loader_cfg = cfg.get(loader)
        if not loader_cfg or not isinstance(loader_cfg.get('dataset'), dict):
            continue
        types = []
        for ds, key in _datasets(loader_cfg['dataset'], f'{loader}.dataset'):
            types.append(str(ds.get('type', '?')))
            for what, path in _dataset_paths(ds):
                if osp.exists(path):
                    continue
                if not any(path.startswith(m[3].rstrip('/') + '/') for m in missing if m[0] == key):
                    missing.append((key, types[-1], what, path))
        evaluator = loader.replace('_dataloader', '_evaluator')
        for path in _evaluator_ann_files(cfg.get(evaluator)):
            if not osp.exists(path) and not any(path.startswith(m[3].rstrip('/') + '/') for m in missing):
                missing.append((evaluator, types[0] if types else '?', 'ann_file', path))
    return missing


def _layout_lines(ds_type: str) -> List[str]:
    name = ds_type.split('.')[-1]
    if name in DATA_LAYOUTS:
        title, lines = DATA_LAYOUTS[name]
        return [f'{name} expects the {title} layout (as upstream\'s configs do):'] + [f'    {x}' for x in lines]
    return [f'{name} reads the paths above (its data_root, ann_file and data_prefix).']


def check_data(cfg: Config, loaders: Sequence[str]) -> None:
    """Exit with one message (no traceback) when a data root or annotation file of ``loaders`` is missing,
    before anything is built. The message names each missing path, the layout the dataset expects,
    docs/datasets.md and the ``--cfg-options`` that points the config elsewhere."""
    missing = missing_data(cfg, loaders)
    if not missing:
        return
    lines = ['mmppma: the data this config reads is not there:']
    lines += [f'  {key}: {what} {path!r} does not exist' for key, _, what, path in missing]
    for ds_type in dict.fromkeys(m[1] for m in missing):
        lines += _layout_lines(ds_type)
    roots = dict.fromkeys(f'{key}.data_root=/path/to/data' if 'dataloader' in key else f'{key}.ann_file=/path/to/file'
                          for key, *_ in missing)
    lines += ['See docs/datasets.md for where to get each data set and how to lay it out. To read it from another',
              'place, set its paths on the command line, e.g.',
              '    --cfg-options ' + ' '.join(roots),
              '(or make data/ a symlink to where the data lives).']
    raise SystemExit('\n'.join(lines))
