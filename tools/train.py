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

from mmppma.utils.runner_setup import (  # noqa: E402
    build_runner,
    check_data,
    finish_distributed,
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
    parser.add_argument('--amp', action='store_true',
                        help="mixed precision: on CUDA mmengine's AmpOptimWrapper (float16, dynamic loss scale; "
                        "optim_wrapper.dtype=bfloat16 for bfloat16), on CPU bfloat16 autocast "
                        "(mmppma.CPUAmpOptimWrapper)")
    return parse_launcher_args(parser, argv)


AMP_WRAPPERS = ('AmpOptimWrapper', 'mmppma.CPUAmpOptimWrapper', 'CPUAmpOptimWrapper')


def apply_amp(cfg: Config, amp: bool) -> None:
    """Choose the optimizer wrapper's precision for this machine. With ``amp``: on CUDA mmengine's AmpOptimWrapper
    (the config's if it has one), on CPU mmppma's CPUAmpOptimWrapper (bfloat16 autocast). Without: a config that
    asks for AmpOptimWrapper on a machine without CUDA is refused naming both ways out."""
    import torch
    wrapper_type = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if not amp:
        if wrapper_type == 'AmpOptimWrapper' and not torch.cuda.is_available():
            raise SystemExit("this config trains with mmengine's AmpOptimWrapper, which needs CUDA: on CPU add --amp "
                             '(bfloat16 autocast) or --cfg-options optim_wrapper.type=OptimWrapper (float32)')
        return
    if wrapper_type not in ('OptimWrapper', *AMP_WRAPPERS):
        raise SystemExit(f'--amp replaces optim_wrapper.type OptimWrapper, but this config uses '
                         f"'{wrapper_type}'; enable mixed precision in the config instead.")
    if torch.cuda.is_available():
        if wrapper_type == 'AmpOptimWrapper':
            print_log('--amp: the config already trains with AmpOptimWrapper', logger='current')
            return
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
        return
    dtype = cfg.optim_wrapper.pop('dtype', None)
    if dtype not in (None, 'bfloat16'):
        raise SystemExit(f'--amp on CPU trains in bfloat16, but the config sets optim_wrapper.dtype={dtype!r}; '
                         'drop it or set it to bfloat16')
    cfg.optim_wrapper.pop('loss_scale', None)  # bfloat16 needs none
    cfg.optim_wrapper.type = 'mmppma.CPUAmpOptimWrapper'
    print_log('--amp on CPU: bfloat16 autocast (mmppma.CPUAmpOptimWrapper)', logger='current')


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
    apply_amp(cfg, args.amp)
    if args.resume is not None:
        apply_resume(cfg, args.resume)
    setup_cpu_distributed(cfg)
    runner = build_runner(cfg)
    runner.train()
    finish_distributed()


if __name__ == '__main__':
    main()
