"""Train with any OpenMMLab 2.0 config (mmpretrain, mmdet, mmseg or plain mmengine) plus mmppma.

The config's ``default_scope`` picks the library whose modules are registered; mmppma is always
imported, so ``type='mmppma.PPMA'`` and resuming full checkpoints under torch >= 2.6 work as they are.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp] [--cfg-options k=v ...]
    torchrun --nproc_per_node=N tools/train.py CONFIG --launcher pytorch
"""
import argparse
import os
import os.path as osp
import sys

# Runs as a script from a checkout: make the checkout's mmppma importable without installing it.
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.logging import print_log  # noqa: E402

from mmppma.utils import (build_runner, register_scope_modules, set_local_rank,  # noqa: E402
                          setup_cpu_distributed, setup_work_dir)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a model (mmppma launcher for OpenMMLab 2.0 configs)')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: config or ./work_dirs/NAME)')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from CKPT; without a path, from the latest checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision (needs CUDA)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. train_cfg.max_epochs=12 "model.backbone.arch=small"')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    # torch.distributed.launch passes --local-rank (torch >= 2.0) or --local_rank.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    set_local_rank(args.local_rank)
    return args


def apply_amp(cfg: Config) -> None:
    """Switch the optimizer wrapper to mmengine's AmpOptimWrapper (dynamic loss scale)."""
    import torch
    if not torch.cuda.is_available():
        raise SystemExit('--amp needs a CUDA device (mmengine AmpOptimWrapper); drop --amp on CPU.')
    wrapper_type = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if wrapper_type == 'AmpOptimWrapper':
        print_log('AMP is already enabled in the config', logger='current')
        return
    if wrapper_type != 'OptimWrapper':
        raise SystemExit(f'--amp replaces optim_wrapper.type OptimWrapper, but this config uses '
                         f"'{wrapper_type}'; enable AMP in the config instead.")
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')


def apply_resume(cfg: Config, resume: str) -> None:
    """``auto``: latest checkpoint of the work dir; otherwise the given checkpoint path."""
    cfg.resume = True
    if resume == 'auto':
        cfg.load_from = None
    else:
        if not osp.isfile(resume) and '://' not in resume:
            raise SystemExit(f'--resume {resume}: no such checkpoint file')
        cfg.load_from = resume


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    cfg.launcher = args.launcher
    register_scope_modules(cfg.get('default_scope', None))
    setup_work_dir(cfg, args.work_dir, args.config)
    if args.amp:
        apply_amp(cfg)
    if args.resume is not None:
        apply_resume(cfg, args.resume)
    setup_cpu_distributed(cfg)
    runner = build_runner(cfg)
    runner.train()


if __name__ == '__main__':
    main()
