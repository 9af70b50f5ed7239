#!/usr/bin/env python
"""PPMA vs RMT backbone: forward+backward time and peak memory, in one run.

    python tools/benchmark_model.py [--arch tiny] [--shape 512 768] [--batch 1] [--iters 3] [--device cpu]
                                    [--impl auto] [--mode train|infer] [--amp fp16|bf16]

``--mode infer`` times inference (``eval()``, ``torch.inference_mode``) instead of a training step and
prints images per second as well; ``--amp`` runs under ``torch.autocast`` with that dtype (CUDA for fp16).

Each model runs in its own fresh subprocess, one after the other, so that neither sees the other's
allocations or caches. Per model: build the backbone (out_indices 0-3, release dense layout), make the input,
then run forward + backward (sum of the outputs) ``1 + iters`` times.

* time: median wall time of the ``iters`` runs after the first (the first includes one-off costs).
* peak memory on CPU: the increase of the process's peak resident set size (``getrusage(RUSAGE_SELF)
  .ru_maxrss``) from just before the first forward to just after its backward. This is the extra resident
  memory the step needed (activations, saved tensors, gradients, temporaries) on top of the model and input;
  allocator reuse can only make it smaller than the sum of all allocations, never larger. On CUDA:
  ``torch.cuda.max_memory_allocated`` over the same step, minus the memory allocated before it.
"""
import argparse
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import time

ROOT = osp.join(osp.dirname(osp.abspath(__file__)), '..')


def worker(args: argparse.Namespace) -> dict:
    sys.path.insert(0, ROOT)
    import torch

    from mmppma.models import PPMA, RMT
    torch.manual_seed(0)
    device = torch.device(args.device)
    cls = {'PPMA': PPMA, 'RMT': RMT}[args.worker]
    train = args.mode == 'train'
    model = cls(args.arch, impl=args.impl).to(device).train(train)
    x = torch.randn(args.batch, 3, *args.shape, device=device)
    amp_dtype = {None: None, 'fp16': torch.float16, 'bf16': torch.bfloat16}[args.amp]

    def step():
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            if train:
                outs = model(x)
                sum(o.float().sum() for o in outs).backward()
                model.zero_grad(set_to_none=True)
            else:
                with torch.inference_mode():
                    model(x)
        if device.type == 'cuda':
            torch.cuda.synchronize()

    if device.type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        step()
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return dict(model=args.worker, time_s=statistics.median(times), times_s=times, peak_bytes=peak,
                stage_s=stage_times(model, x, device, max(1, args.iters)) if train else [],
                threads=torch.get_num_threads(), torch=torch.__version__,
                device=torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu')


def stage_times(model, x, device, iters: int) -> list:
    """Forward+backward time of each stage alone on its real input (min of ``iters`` runs), to show where
    the time goes. Stage i's input is the previous stages' output computed without gradients."""
    import torch
    with torch.no_grad():
        h = model.patch_embed(x)
    result = []
    for layer in model.layers:
        inp = h.detach().requires_grad_()
        runs = []
        for _ in range(iters):
            start = time.perf_counter()
            out, _ = layer(inp)
            out.float().sum().backward()
            if device.type == 'cuda':
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - start)
        result.append(min(runs))
        with torch.no_grad():
            h = layer(inp)[1]
    model.zero_grad(set_to_none=True)
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--arch', default='tiny')
    parser.add_argument('--shape', type=int, nargs=2, default=[512, 768], metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--iters', type=int, default=3, help='timed runs after the first')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--impl', default='auto', choices=['auto', 'torch', 'triton', 'reference'],
                        help='attention implementation passed to the ops')
    parser.add_argument('--mode', default='train', choices=['train', 'infer'],
                        help='time a training step (forward + backward) or inference')
    parser.add_argument('--amp', choices=['fp16', 'bf16'], help='run under torch.autocast with this dtype')
    parser.add_argument('--worker', choices=['PPMA', 'RMT'], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    results = {}
    for name in ('PPMA', 'RMT'):
        cmd = [sys.executable, osp.abspath(__file__), '--worker', name, '--arch', args.arch, '--shape',
               *map(str, args.shape), '--batch', str(args.batch), '--iters', str(args.iters), '--device',
               args.device, '--impl', args.impl, '--mode', args.mode] + (['--amp', args.amp] if args.amp else [])
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if out.returncode:
            sys.stderr.write(out.stderr)
            raise SystemExit(f'{name} benchmark failed (exit {out.returncode})')
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    p, r = results['PPMA'], results['RMT']
    h, w = args.shape
    what = 'forward+backward' if args.mode == 'train' else 'inference'
    print(f'{args.arch} backbones, input {args.batch}x3x{h}x{w}, {what}, device {p["device"]}, '
          f'{p["threads"]} threads, torch {p["torch"]}, impl={args.impl}, amp={args.amp or "off"}')
    print(f'{"model":6s} {"median time (s)":>16s} {"images/s":>10s} {"peak memory (MiB)":>18s}')
    for name, res in results.items():
        print(f'{name:6s} {res["time_s"]:16.3f} {args.batch / res["time_s"]:10.1f} {res["peak_bytes"] / 2**20:18.1f}')
    for i, (ps, rs) in enumerate(zip(p['stage_s'], r['stage_s'])):
        print(f'  stage {i + 1}: PPMA {ps:.3f} s, RMT {rs:.3f} s (fwd+bwd of the stage alone)')
    print(f'PPMA / RMT: time {p["time_s"] / r["time_s"]:.2f}x, peak memory '
          f'{p["peak_bytes"] / max(r["peak_bytes"], 1):.2f}x')
    return 0


if __name__ == '__main__':
    sys.exit(main())
