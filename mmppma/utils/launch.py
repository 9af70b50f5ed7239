"""Shared pieces of ``tools/train.py`` and ``tools/test.py``: one launcher for every OpenMMLab library.

The config's ``default_scope`` (``mmdet``, ``mmseg``, ``mmpretrain``, ...) decides which library's
modules get registered; mmppma itself is always imported. Downstream libraries are imported here only
when a config asks for them, so ``import mmppma`` stays free of them.
"""
import argparse
import datetime
import importlib
import os
import os.path as osp
from typing import Optional

import torch
from mmengine.config import Config
from mmengine.logging import print_log

__all__ = ['register_scope_modules', 'build_runner', 'setup_work_dir', 'setup_cpu_distributed',
           'set_local_rank', 'launcher_parser', 'parse_launcher_args', 'load_launch_config', 'apply_test_amp']

# default_scope -> the package that owns it (the scope and package names differ only for mmseg).
_SCOPE_PACKAGES = {'mmdet': 'mmdet', 'mmseg': 'mmseg', 'mmpretrain': 'mmpretrain', 'mmdet3d': 'mmdet3d'}
_PIP_NAMES = {'mmseg': 'mmsegmentation'}


def register_scope_modules(default_scope: Optional[str]) -> None:
    """Import mmppma and register the modules of the library named by ``default_scope``.

    ``None`` or ``'mmengine'`` registers nothing beyond mmppma. A library without
    ``utils.register_all_modules`` is imported as a plain package (its registries' ``locations`` do
    the rest).
    """
    import mmppma  # noqa: F401  (registers mmppma's modules and the checkpoint allowlist)
    if default_scope in (None, 'mmengine', 'mmppma'):
        return
    package = _SCOPE_PACKAGES.get(default_scope, default_scope)
    try:
        importlib.import_module(package)
    except ImportError as err:
        pip_name = _PIP_NAMES.get(package, package)
        raise ImportError(f"the config's default_scope='{default_scope}' needs the package '{package}', "
                          f'which failed to import ({err}). Install it (pip install {pip_name}, '
                          'or run bash tools/setup_env.sh) or fix default_scope in the config.') from err
    try:
        utils = importlib.import_module(f'{package}.utils')
    except ModuleNotFoundError as err:
        if err.name != f'{package}.utils':
            raise  # a real missing dependency, not a library without a utils module
        return
    register = getattr(utils, 'register_all_modules', None)
    if register is not None:
        register(init_default_scope=False)


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
    cfg = Config.fromfile(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    cfg.launcher = args.launcher
    register_scope_modules(cfg.get('default_scope', None))
    setup_work_dir(cfg, args.work_dir, args.config)
    return cfg
