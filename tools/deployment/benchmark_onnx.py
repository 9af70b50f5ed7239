#!/usr/bin/env python
"""onnxruntime (CPU) against torch eager: inference time of exported classifiers, in one run.

    python tools/deployment/benchmark_onnx.py [CONFIG ...] [--shape 224 224] [--batch 8] [--iters 5]
                                              [--threads N]

Default configs: configs/ppma_t_8xb128_in1k.py and configs/rmt_t_8xb128_in1k.py (random weights). Each model
is exported as pytorch2onnx.py exports it (logits, static shape), then run alternately in torch eager
(``torch.inference_mode``) and in onnxruntime's CPU provider, both with ``--threads`` threads (default: torch's
count), one warm-up run each, then ``--iters`` timed runs each; the table gives the median wall time per
batch and the ratio torch / onnxruntime (above 1: onnxruntime is faster). docs/deployment.md.
"""
import argparse
import os.path as osp
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))  # run from a checkout
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from pytorch2onnx import build_model  # noqa: E402

from mmppma.deploy import compare_onnx, export_module, export_onnx  # noqa: E402

ROOT = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..')
DEFAULT_CONFIGS = [osp.join(ROOT, 'configs', f'{name}_t_8xb128_in1k.py') for name in ('ppma', 'rmt')]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('configs', nargs='*', default=DEFAULT_CONFIGS,
                        help='classifier configs (default: PPMA-T, RMT-T)')
    parser.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--iters', type=int, default=5, help='timed runs per backend (after one warm-up run)')
    parser.add_argument('--threads', type=int, default=torch.get_num_threads(), help='threads of both backends')
    return parser.parse_args(argv)


def bench(config: str, args: argparse.Namespace, workdir: str) -> dict:
    import onnxruntime
    torch.manual_seed(0)
    module, _ = export_module(build_model(config))
    x = torch.randn(args.batch, 3, *args.shape)
    path = osp.join(workdir, osp.splitext(osp.basename(config))[0] + '.onnx')
    export_onnx(module, x, path)
    [(_, diff)] = compare_onnx(path, module, [x])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = onnxruntime.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    feed = {session.get_inputs()[0].name: x.numpy()}

    def run_torch():
        with torch.inference_mode():
            module(x)

    def run_onnx():
        session.run(None, feed)

    times = {'torch': [], 'onnxruntime': []}
    for step in range(args.iters + 1):  # alternating, so that a load change hits both alike
        for name, run in (('torch', run_torch), ('onnxruntime', run_onnx)):
            start = time.perf_counter()
            run()
            if step:
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    return dict(name=osp.basename(config), diff=diff, **median)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f'torch {torch.__version__}, {args.threads} threads, batch {args.batch}, '
          f'{args.shape[0]}x{args.shape[1]}, median of {args.iters} runs')
    with tempfile.TemporaryDirectory() as workdir:
        rows = [bench(config, args, workdir) for config in args.configs]
    print('| model | torch eager (s/batch) | onnxruntime (s/batch) | torch / onnxruntime | max rel. diff |')
    print('|---|---|---|---|---|')
    for r in rows:
        print(f"| {r['name']} | {r['torch']:.3f} | {r['onnxruntime']:.3f} | {r['torch'] / r['onnxruntime']:.2f} "
              f"| {r['diff']:.1e} |")
    return 0


if __name__ == '__main__':
    sys.exit(main())
