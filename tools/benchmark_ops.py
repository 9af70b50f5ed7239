#!/usr/bin/env python
"""Time and peak memory of each polyline-mask op, every implementation measured in the same run.

    python tools/benchmark_ops.py                  # CPU (and CUDA when present), default cases
    python tools/benchmark_ops.py --device cpu --cases whole_196 cc_56x56 --repeat 5

Each (case, impl) runs forward + backward. CPU peak memory is the growth of the process's peak resident
set during one forward+backward, measured in a fresh subprocess per (case, impl) so that runs cannot
hide each other's peaks; on CUDA it is ``torch.cuda.max_memory_allocated`` above the inputs.
Ratios are printed against ``reference`` (dense N x N mask), the slowest, most obviously correct path.
The ``branch`` column names the branch the torch path of whole attention takes at the case's size
on the device (:func:`mmppma.ops.whole_attention_branch`: 'autograd' while the score elements fit, else
'blockwise').
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

# name: (op, B, heads, H, W, d)
CASES = {
    'whole_196': ('whole', 8, 8, 14, 14, 32),
    'whole_32x48': ('whole', 1, 8, 32, 48, 32),
    'whole_64x64': ('whole', 1, 4, 64, 64, 32),
    'cc_56x56': ('criss_cross', 8, 4, 56, 56, 16),
    'cc_128x192': ('criss_cross', 1, 4, 128, 192, 16),
    'linear_56x56': ('linear', 2, 4, 56, 56, 16),
    'matvec_128x192': ('matvec', 1, 4, 128, 192, 16),
}
IMPLS = ('reference', 'torch', 'triton', 'sdpa_bias', 'flex')
# baselines for whole attention only: torch's fused attention with the dense N x N bias passed as
# attn_mask (two calls, release form), and FlexAttention computing the bias in a score_mod from the tables
BASELINES = ('sdpa_bias', 'flex')


def make_inputs(op, b, heads, h, w, d, device, dtype):
    g = torch.Generator(device='cpu').manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_()

    q, k, v = rand(b, heads, h, w, d), rand(b, heads, h, w, d), rand(b, heads, h, w, d)
    la = (-torch.rand(b, heads, h, w, generator=g) * 0.5).to(device).requires_grad_()
    lb = (-torch.rand(b, heads, h, w, generator=g) * 0.5).to(device).requires_grad_()
    return q, k, v, la, lb


def whole_baseline(impl, q, k, v, la, lb, scale):
    from mmppma import ops
    b, heads, h, w, d = q.shape
    qf, kf, vf = (t.flatten(2, 3) for t in (q, k, v))
    if impl == 'sdpa_bias':
        def run():
            m = ops.polyline_mask(la, lb, form='v2h').to(q.dtype)
            sdpa = torch.nn.functional.scaled_dot_product_attention
            out = 0.5 * sdpa(qf, kf, vf, attn_mask=m, scale=scale) + \
                0.5 * sdpa(qf, kf, vf, attn_mask=m.transpose(-1, -2), scale=scale)
            return out.unflatten(2, (h, w))
        return run
    from torch.nn.attention.flex_attention import flex_attention  # torch >= 2.5
    ca, cb = ops.decay_tables(la, lb)
    ca, cb = ca.flatten(2), cb.flatten(2)

    def seg(c_hi, c_lo, ge):
        return torch.where(ge, c_hi - c_lo, c_lo - c_hi)

    def v2h(score, bi, hi, qi, ki):
        i, j, kr, lc = qi // w, qi % w, ki // w, ki % w
        return (score + seg(ca[bi, hi, qi], ca[bi, hi, i * w + lc], j >= lc) +
                seg(cb[bi, hi, i * w + lc], cb[bi, hi, ki], i >= kr))

    def h2v(score, bi, hi, qi, ki):
        return v2h(score, bi, hi, ki, qi)

    flex = torch.compile(flex_attention)
    return lambda: (0.5 * flex(qf, kf, vf, score_mod=v2h, scale=scale) +
                    0.5 * flex(qf, kf, vf, score_mod=h2v, scale=scale)).unflatten(2, (h, w))


def make_fn(op, impl, q, k, v, la, lb):
    from mmppma import ops
    scale = q.shape[-1]**-0.5
    if impl in BASELINES:
        if op != 'whole':
            raise NotImplementedError(f'{impl} is a baseline for whole attention only')
        return whole_baseline(impl, q, k, v, la, lb, scale)
    if op == 'whole':
        return lambda: ops.ppma_attention(q, k, v, la, lb, scale=scale, impl=impl)
    if op == 'criss_cross':
        return lambda: ops.criss_cross_attention(q, k, v, la, lb, scale=scale, impl=impl)
    if op == 'linear':
        return lambda: ops.ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True, impl=impl)
    if op == 'matvec':
        if impl == 'reference':
            def dense():
                lmask = ops.polyline_mask(la, lb, form='v2h', space='linear')
                return (lmask @ v.flatten(2, 3)).reshape(v.shape)
            return dense
        return lambda: ops.polyline_mask_matvec(v, la, lb, form='v2h')
    raise KeyError(op)


def branch(case, impl, device):
    """The torch path's size-chosen branch for whole attention on ``device``, '-' for everything else."""
    from mmppma import ops
    op, b, heads, h, w, _ = CASES[case]
    if (op, impl) != ('whole', 'torch'):
        return '-'
    return ops.whole_attention_branch(b, heads, h, w, device=torch.device(device))


def rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def measure(case, impl, device, dtype, repeat):
    op, *shape = CASES[case]
    inputs = make_inputs(op, *shape, device=device, dtype=dtype)
    fn = make_fn(op, impl, *inputs)

    def step():
        out = fn()
        out.float().square().mean().backward()
        for t in inputs:
            t.grad = None

    if device == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base = rss_bytes()
        step()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    times = []
    for _ in range(repeat):
        if device == 'cuda':
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if device == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {'time_ms': 1e3 * sorted(times)[len(times) // 2], 'peak_mb': max(peak, 0) / 2**20}


def run_worker(args):
    torch.set_num_threads(args.threads) if args.threads else None
    dtype = getattr(torch, args.dtype)
    try:
        result = measure(args.cases[0], args.impls[0], args.device, dtype, args.repeat)
    except Exception as exc:  # report, do not crash the table
        result = {'error': f'{type(exc).__name__}: {str(exc).splitlines()[0][:120]}'}
    print('RESULT ' + json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cases', nargs='+', default=list(CASES), choices=list(CASES))
    parser.add_argument('--impls', nargs='+', default=None, choices=IMPLS,
                        help='default: reference and torch, plus triton on CUDA')
    parser.add_argument('--device', choices=['cpu', 'cuda', 'all'], default='all')
    parser.add_argument('--dtype', default='float32', choices=['float32', 'float16', 'bfloat16'])
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--threads', type=int, default=0)
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return run_worker(args)
    devices = ['cpu', 'cuda'] if args.device == 'all' else [args.device]
    devices = [d for d in devices if d == 'cpu' or torch.cuda.is_available()]
    name = torch.cuda.get_device_name() if 'cuda' in devices else ''
    print(f'# torch {torch.__version__}; devices: {", ".join(devices)} {name}; dtype {args.dtype}; '
          f'median of {args.repeat} fwd+bwd')
    print(f'{"device":6} {"case":16} {"impl":10} {"branch":10} {"time ms":>10} {"peak MB":>10} {"time/ref":>9} '
          f'{"mem/ref":>8}')
    for device in devices:
        impls = args.impls or (['reference', 'torch'] + (['triton', *BASELINES] if device == 'cuda' else []))
        for case in args.cases:
            ref = None
            for impl in impls:
                cmd = [sys.executable, __file__, '--worker', '--cases', case, '--impls', impl, '--device', device,
                       '--dtype', args.dtype, '--repeat', str(args.repeat), '--threads', str(args.threads)]
                out = subprocess.run(cmd, capture_output=True, text=True)
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith('RESULT ')]
                if lines:
                    res = json.loads(lines[-1][7:])
                else:  # the worker died: -9 is the kernel's out-of-memory killer on Linux
                    why = 'killed, likely out of memory' if out.returncode == -9 else out.stderr.strip()[-160:]
                    res = {'error': f'failed (exit code {out.returncode}): {why}'}
                if 'error' in res and impl in BASELINES and res['error'].startswith('NotImplementedError'):
                    continue
                if 'error' in res:
                    print(f'{device:6} {case:16} {impl:10} {branch(case, impl, device):10} {res["error"]}')
                    continue
                if impl == 'reference':
                    ref = res
                tr = f'{res["time_ms"] / ref["time_ms"]:.2f}' if ref else '-'
                mr = f'{res["peak_mb"] / max(ref["peak_mb"], 1e-9):.2f}' if ref else '-'
                print(f'{device:6} {case:16} {impl:10} {branch(case, impl, device):10} {res["time_ms"]:10.1f} '
                      f'{res["peak_mb"]:10.1f} {tr:>9} {mr:>8}', flush=True)


if __name__ == '__main__':
    main()
