"""Evaluate a checkpoint with any OpenMMLab 2.0 config (mmpretrain, mmdet, mmseg or plain mmengine).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl] [--amp] [--cfg-options k=v ...]
    torchrun --nproc_per_node=N tools/test.py CONFIG CHECKPOINT --launcher pytorch
"""
import argparse
import os.path as osp
import sys

# Runs as a script from a checkout: make the checkout's mmppma importable without installing it.
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmengine.config import Config  # noqa: E402

from mmppma.utils.runner_setup import (  # noqa: E402
    apply_test_amp,
    build_runner,
    check_data,
    finish_distributed,
    launcher_parser,
    load_launch_config,
    parse_launcher_args,
    setup_cpu_distributed,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = launcher_parser('Test a checkpoint (mmppma launcher for OpenMMLab 2.0 configs)',
                             'where logs and metrics go (default: config or ./work_dirs/NAME)')
    parser.add_argument('checkpoint', help='checkpoint file (path or URL)')
    parser.add_argument('--out', help='also dump the raw predictions to this pickle file')
    parser.add_argument('--amp', action='store_true',
                        help='evaluate under autocast: bfloat16 on CPU (the faster CPU setting), float16 on CUDA')
    return parse_launcher_args(parser, argv)


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
    cfg = load_launch_config(args)
    check_data(cfg, ['test_dataloader'])
    cfg.load_from = args.checkpoint
    cfg.resume = False
    if args.out is not None:
        add_dump_results(cfg, args.out)
    if args.amp:
        apply_test_amp(cfg)
    setup_cpu_distributed(cfg)
    runner = build_runner(cfg)
    runner.test()
    finish_distributed()


if __name__ == '__main__':
    main()
