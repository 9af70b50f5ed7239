#!/usr/bin/env python
"""onnxruntime (CPU) against torch eager: inference time of exported models, several cases in one run.

    python tools/deployment/benchmark_onnx.py [--case CONFIG B H W ...] [--file CONFIG B H W ONNX ...]
                                              [--dynamic] [--paste-masks] [--iters 5] [--threads N] [--profile]
                                              [--cfg-options k=v ...]

Default cases: the PPMA-T classifier (configs/ppma_t_8xb128_in1k.py) at batch 1 and batch 8, 224 x 224, the
PPMA-T UPerNet (configs/upernet_ppma_t_512x512_160k_ade20k.py) at batch 1, 512 x 512, and the PPMA-T Mask
R-CNN (configs/mask_rcnn_ppma_t_1x_coco.py) at batch 1, 800 x 1344; random weights (``--case`` replaces them;
``--cfg-options`` change every case's and file's config, e.g. ``model.test_cfg.rcnn.score_thr=0.0``: the random
weights' box head scores every class below mmdet's 0.05, so only then does a Mask R-CNN detect, 100 boxes).
Each case is exported as pytorch2onnx.py exports it (at the case's batch and size; ``--dynamic``: with
dynamic batch, height and width, traced at a batch of 2 or more; ``--paste-masks``: a Mask R-CNN with its masks
also pasted in the graph), and each ``--file`` is an ONNX file written before (e.g. by another version of
pytorch2onnx.py, with the weights ``--seed 0`` draws: random weights are drawn as here) timed at its case's
input. Each is checked against torch once (a Mask R-CNN: against ``model.predict``, which is also what torch
runs). Then all are timed in rounds, one warm-up round and ``--iters`` timed ones: each round runs, in turn,
torch eager (``torch.inference_mode``) once per config and input, and each file in onnxruntime's CPU provider,
all with ``--threads`` threads (default: torch's count), so that a change of load hits every row alike. It
prints the machine (CPU model, cores, GPU, load average before and after), the versions, and a table of the
median and best wall time per batch and the ratio torch / onnxruntime of the medians (above 1: onnxruntime is
faster); rows of one config and input share torch's times (a ``--file`` and a ``--case`` of them compare two
files). ``--profile``: also each file's onnxruntime time of one more run by op type and by model part
(onnxruntime's profiler, :func:`mmppma.deploy.profile_onnx`). docs/deployment.md.
"""
import argparse
import functools
import gc
import os
import os.path as osp
import platform
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))  # run from a checkout

from mmppma.deploy import (  # noqa: E402
    build_model,
    compare_onnx,
    dynamic_axes,
    export_module,
    export_onnx,
    model_kind,
    onnx_session,
    profile_onnx,
)

ROOT = osp.join(osp.dirname(osp.abspath(__file__)), '..', '..')
DEFAULT_CASES = [
    ('configs/ppma_t_8xb128_in1k.py', 1, 224, 224),
    ('configs/ppma_t_8xb128_in1k.py', 8, 224, 224),
    ('configs/upernet_ppma_t_512x512_160k_ade20k.py', 1, 512, 512),
    ('configs/mask_rcnn_ppma_t_1x_coco.py', 1, 800, 1344),
]


def parse_args(argv=None) -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--case', nargs=4, action='append', metavar=('CONFIG', 'B', 'H', 'W'),
                        help='a config at batch B, input H x W (repeat for more; default: the cases above)')
    parser.add_argument('--file', nargs=5, action='append', default=[], metavar=('CONFIG', 'B', 'H', 'W', 'ONNX'),
                        help='time an ONNX file written before, of the config (random weights, --seed 0) at batch B, '
                        'input H x W (repeat for more; run before the cases)')
    parser.add_argument('--dynamic', action='store_true', help='export the cases with dynamic batch, height and width')
    parser.add_argument('--paste-masks', action='store_true',
                        help='export a Mask R-CNN case with its masks also pasted in the graph (output masks)')
    parser.add_argument('--iters', type=int, default=5, help='timed runs per backend (after one warm-up run)')
    parser.add_argument('--threads', type=int, default=torch.get_num_threads(), help='threads of both backends')
    parser.add_argument('--profile', action='store_true',
                        help="print each file's onnxruntime time by op type and by model part (one more run)")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help="override settings of every case's and file's config (as in tools/train.py)")
    args = parser.parse_args(argv)
    cases = args.case or ([] if args.file else [(osp.join(ROOT, c), b, h, w) for c, b, h, w in DEFAULT_CASES])
    args.cases = [(config, int(b), int(h), int(w), None) for config, b, h, w in cases]
    args.cases = [(config, int(b), int(h), int(w), path) for config, b, h, w, path in args.file] + args.cases
    for *_, path in args.cases:
        if path is not None and not osp.isfile(path):
            parser.error(f'--file: no file {path}')
    return args


def machine() -> str:
    """CPU model, core count and GPU, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as info:
            cpu = next(line.split(':', 1)[1].strip() for line in info if line.startswith('model name'))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'
    return f'{cpu}, {os.cpu_count()} cores, {gpu}'


def load() -> str:
    return ' '.join(f'{v:.1f}' for v in os.getloadavg()) if hasattr(os, 'getloadavg') else 'n/a'


def prepare(case, args: argparse.Namespace, workdir: str) -> dict:
    """Build, export (or take the file) and check one case: its row's name, input and difference, and its two
    runs (torch and onnxruntime, one batch each); ``key``: the config and input, whose torch run rows share."""
    config, batch, height, width, path = case
    torch.manual_seed(0)
    model = build_model(config, cfg_options=args.cfg_options)
    paste = args.paste_masks and model_kind(model) == 'detector'
    module, kind = export_module(model, paste_masks=paste)
    x = torch.randn(batch, 3, height, width)
    if path is None:
        form = ('dynamic' if args.dynamic else 'fixed size') + (', masks pasted' if paste else '')
        path = osp.join(workdir, f'{osp.splitext(osp.basename(config))[0]}_{batch}x{height}x{width}.onnx')
        export_onnx(module, x, path, dynamic=args.dynamic)
    else:
        form = f'{osp.basename(path)}, ' + ('dynamic' if dynamic_axes(path) else 'fixed size')
    if kind == 'detector':  # checked against, and timed as, mmdet's inference (diff: the outputs before NMS)
        from mmppma.deploy.mask_rcnn import compare_with_predict, data_samples
        diff = max(max(c.rpn, c.roi) for c in compare_with_predict(path, model, x))
        samples = data_samples(batch, height, width)
        module = functools.partial(model.predict, batch_data_samples=samples)
    else:
        [(_, diff)] = compare_onnx(path, module, [x])
    session = onnx_session(path, threads=args.threads)
    feed = {session.get_inputs()[0].name: x.numpy()}

    def run_torch():
        with torch.inference_mode():
            module(x)

    return dict(name=f'{osp.basename(config)} ({kind}; {form})', batch=batch, size=f'{height} x {width}', diff=diff,
                key=(config, batch, height, width), path=path, feed=feed, run_torch=run_torch,
                run_onnx=functools.partial(session.run, None, feed))


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def time_rounds(rows, iters: int) -> None:
    """One warm-up round and ``iters`` timed ones, each running torch once per key and every row's file in turn;
    each row gets the median and best of its own times and its key's torch times."""
    torch_times, onnx_times = {}, [[] for _ in rows]
    for step in range(iters + 1):
        done = set()
        for row, times in zip(rows, onnx_times):
            if row['key'] not in done:
                done.add(row['key'])
                seconds = timed(row['run_torch'])
                if step:
                    torch_times.setdefault(row['key'], []).append(seconds)
            seconds = timed(row['run_onnx'])
            if step:
                times.append(seconds)
    for row, times in zip(rows, onnx_times):
        row.update(torch=statistics.median(torch_times[row['key']]), onnxruntime=statistics.median(times),
                   best=min(times))


def print_profile(row, threads: int) -> None:
    """The row's file in onnxruntime's profiler: its time by op type and by model part."""
    found = profile_onnx(row['path'], row['feed'], threads=threads)
    print(f"\nonnxruntime profile of {row['name']}, {row['size']}: {found.total:.3f} s of kernels in one run")
    for title, table in (('model part', found.parts), ('op type', found.ops)):
        print(f'| {title} | s | share |\n|---|---|---|')
        for name, seconds in table.items():
            if seconds >= 0.005 * found.total:  # the parts over 0.5 %
                print(f'| {name} | {seconds:.3f} | {100 * seconds / found.total:.1f} % |')


def main(argv=None) -> int:
    import onnxruntime
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f'machine: {machine()}; load average (1, 5, 15 min) at the start: {load()}')
    print(f'torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, {args.threads} thread(s) per backend, '
          f'{args.iters} timed rounds after one warm-up round')
    with tempfile.TemporaryDirectory() as workdir:
        rows = [prepare(case, args, workdir) for case in args.cases]
        time_rounds(rows, args.iters)
        print(f'load average at the end: {load()}')
        print('| model | batch | input | torch eager (s / batch) | onnxruntime (s / batch) | onnxruntime best '
              '| torch / onnxruntime | max rel. diff |')
        print('|---|---|---|---|---|---|---|---|')
        for r in rows:
            print(f"| {r['name']} | {r['batch']} | {r['size']} | {r['torch']:.3f} | {r['onnxruntime']:.3f} "
                  f"| {r['best']:.3f} | {r['torch'] / r['onnxruntime']:.2f} | {r['diff']:.1e} |")
        for r in rows:  # the sessions and models go before the profiles (a Mask R-CNN's take GBs each)
            del r['run_torch'], r['run_onnx']
        gc.collect()
        for r in rows if args.profile else ():
            print_profile(r, args.threads)
    return 0


if __name__ == '__main__':
    sys.exit(main())
