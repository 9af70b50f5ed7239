#!/usr/bin/env python
"""Eager against ``torch.compile`` (its defaults, as mmengine's ``compile=True`` calls it): per backbone, the
compile time and the steady-state time of inference and of a training step, ratios from the same process.

    python tools/benchmark_compile.py [--models PPMA RMT] [--arch tiny] [--modes infer train] [--iters 3]
                                      [--infer-batch 8] [--infer-shape 224 224]
                                      [--train-batch 1] [--train-shape 512 768] [--impl auto] [--device cpu]

``infer``: ``eval()`` under ``torch.inference_mode``; ``train``: ``train()``, forward and backward of the sum
of the four outputs. Each (model, mode) runs in its own fresh subprocess: build the model, run eager once
(warm-up) and ``iters`` times, then compile and run once (``compile``: the wall time of that first call, which
traces, compiles and runs) and ``iters`` times. Times are medians of the ``iters`` runs; ``max rel diff`` is
max |compiled - eager| / max |eager| over the outputs of the last runs.
"""
import argparse
import json
import os.path as osp
import statistics
import subprocess
import sys
import time

ROOT = osp.join(osp.dirname(osp.abspath(__file__)), '..')


def worker(args: argparse.Namespace) -> dict:
    import torch

    from mmppma.models import PPMA, RMT
    torch.manual_seed(0)
    train = args.worker_mode == 'train'
    model = {'PPMA': PPMA, 'RMT': RMT}[args.worker](args.arch, impl=args.impl).to(args.device).train(train)
    batch, shape = (args.train_batch, args.train_shape) if train else (args.infer_batch, args.infer_shape)
    x = torch.randn(batch, 3, *shape, device=args.device)

    def step(module):
        if train:
            outs = module(x)
            sum(o.sum() for o in outs).backward()
            for p in model.parameters():
                p.grad = None
            return [o.detach() for o in outs]
        with torch.inference_mode():
            return list(module(x))

    def timed(module, iters):
        times, outs = [], None
        for _ in range(iters):
            start = time.perf_counter()
            outs = step(module)
            times.append(time.perf_counter() - start)
        return times, outs

    timed(model, 1)
    eager_times, eager_outs = timed(model, args.iters)
    compiled = torch.compile(model)
    (compile_time, ), _ = timed(compiled, 1)
    compiled_times, compiled_outs = timed(compiled, args.iters)
    diff = max(((c - e).abs().max() / e.abs().max()).item() for c, e in zip(compiled_outs, eager_outs))
    return dict(model=args.worker, mode=args.worker_mode, batch=batch, shape=list(shape),
                eager=statistics.median(eager_times), compiled=statistics.median(compiled_times),
                compile=compile_time, diff=diff)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', default=['PPMA', 'RMT'], choices=['PPMA', 'RMT'])
    parser.add_argument('--arch', default='tiny', choices=['tiny', 'small', 'base', 't', 's', 'b'])
    parser.add_argument('--modes', nargs='+', default=['infer', 'train'], choices=['infer', 'train'])
    parser.add_argument('--iters', type=int, default=3, help='timed runs of each, after the warm-up / compile')
    parser.add_argument('--infer-batch', type=int, default=8)
    parser.add_argument('--infer-shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'))
    parser.add_argument('--train-batch', type=int, default=1)
    parser.add_argument('--train-shape', type=int, nargs=2, default=[512, 768], metavar=('H', 'W'))
    parser.add_argument('--impl', default='auto', choices=['auto', 'torch', 'triton', 'reference'])
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--worker', choices=['PPMA', 'RMT'], help=argparse.SUPPRESS)
    parser.add_argument('--worker-mode', choices=['infer', 'train'], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    rows, failed = [], False
    for mode in args.modes:
        for name in args.models:
            cmd = [sys.executable, osp.abspath(__file__), *(argv if argv is not None else sys.argv[1:]),
                   '--worker', name, '--worker-mode', mode]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f'{name} {mode} failed:', proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                failed = True
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(f"| {r['model']}-{args.arch[0].upper()} | {r['mode']} | {r['batch']} x {r['shape'][0]} x "
                        f"{r['shape'][1]} | {r['eager']:.3f} | {r['compiled']:.3f} | "
                        f"{r['eager'] / r['compiled']:.2f} | {r['compile']:.0f} | {r['diff']:.1e} |")
            print(rows[-1], file=sys.stderr, flush=True)
    print('| model | mode | batch x H x W | eager (s) | compiled (s) | eager / compiled | compile (s) | '
          'max rel diff |')
    print('|---|---|---|---|---|---|---|---|')
    print('\n'.join(rows))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
