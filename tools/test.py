"""Evaluate a checkpoint with any OpenMMLab 2.0 config (mmpretrain, mmdet, mmseg or plain mmengine).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl] [--cfg-options k=v ...]
    torchrun --nproc_per_node=N tools/test.py CONFIG CHECKPOINT --launcher pytorch
"""
import argparse
import os.path as osp
import sys

# Runs as a script from a checkout: make the checkout's mmppma importable without installing it.
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import Config, DictAction  # noqa: E402

from mmppma.utils import (build_runner, register_scope_modules, set_local_rank,  # noqa: E402
                          setup_cpu_distributed, setup_work_dir)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test a checkpoint (mmppma launcher for OpenMMLab 2.0 configs)')
    parser.add_argument('config', help='config file path')
    parser.add_argument('checkpoint', help='checkpoint file (path or URL)')
    parser.add_argument('--work-dir', help='where logs and metrics go (default: config or ./work_dirs/NAME)')
    parser.add_argument('--out', help='also dump the raw predictions to this pickle file')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. test_dataloader.batch_size=2')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    set_local_rank(args.local_rank)
    return args


def add_dump_results(cfg: Config, out: str) -> None:
    """Append mmengine's DumpResults metric so the predictions are written to ``out``."""
    if not out.endswith(('.pkl', '.pickle')):
        raise SystemExit(f'--out {out}: the output file must end with .pkl or .pickle')
    dump = dict(type='DumpResults', out_file_path=out)
    evaluator = cfg.test_evaluator
    if isinstance(evaluator, (list, tuple)):
        cfg.test_evaluator = [*evaluator, dump]
    elif 'metrics' in evaluator:  # dict(type='Evaluator', metrics=...)
        metrics = evaluator['metrics']
        evaluator['metrics'] = [*(metrics if isinstance(metrics, (list, tuple)) else [metrics]), dump]
    else:
        cfg.test_evaluator = [evaluator, dump]


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    cfg.launcher = args.launcher
    register_scope_modules(cfg.get('default_scope', None))
    setup_work_dir(cfg, args.work_dir, args.config)
    cfg.load_from = args.checkpoint
    cfg.resume = False
    if args.out is not None:
        add_dump_results(cfg, args.out)
    setup_cpu_distributed(cfg)
    runner = build_runner(cfg)
    runner.test()


if __name__ == '__main__':
    main()
