"""Train with any OpenMMLab 2.0 config (mmpretrain, mmdet, mmseg or plain mmengine) plus mmppma.

The config's ``default_scope`` picks the library whose modules are registered; mmppma is always
imported, so ``type='mmppma.PPMA'`` and resuming full checkpoints under torch >= 2.6 work as they are.

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]] [--amp] [--cfg-options k=v ...]
    torchrun --nproc_per_node=N tools/train.py CONFIG --launcher pytorch
"""
import argparse
import os.path as osp
import sys

# Runs as a script from a checkout: make the checkout's mmppma importable without installing it.
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import Config  # noqa: E402
from mmengine.logging import print_log  # noqa: E402

from mmppma.utils import (  # noqa: E402
    build_runner,
    check_data,
    launcher_parser,
    load_launch_config,
    parse_launcher_args,
    setup_cpu_distributed,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = launcher_parser('Train a model (mmppma launcher for OpenMMLab 2.0 configs)',
                             'where logs and checkpoints go (default: config or ./work_dirs/NAME)')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from CKPT; without a path, from the latest checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true', help='automatic mixed precision (needs CUDA)')
    return parse_launcher_args(parser, argv)


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
    cfg = load_launch_config(args)
    check_data(cfg, ['train_dataloader'] + (['val_dataloader'] if cfg.get('val_cfg') else []))
    if args.amp:
        apply_amp(cfg)
    if args.resume is not None:
        apply_resume(cfg, args.resume)
    setup_cpu_distributed(cfg)
    runner = build_runner(cfg)
    runner.train()


if __name__ == '__main__':
    main()
