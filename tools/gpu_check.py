#!/usr/bin/env python
"""Check mmppma's Triton kernels on this machine's GPU: every op and dtype at the shipped shapes against a float64
reference, a determinism check, and a speed table against ``scaled_dot_product_attention`` (flash backend).

    python tools/gpu_check.py                                  # every shipped shape, fp32 / fp16 / bf16
    python tools/gpu_check.py --shapes cls_224 upernet_512 --no-speed
    python tools/gpu_check.py --quick                          # a few minutes: cls_224 of PPMA-T, RMT-T, MLLA-T
    python tools/gpu_check.py --simulate 90                    # no GPU: the CUDA code path on CPU, tiny shapes

Shapes are the attention stages of the shipped backbones at the shipped input sizes (read from the arch tables,
``mmppma.models.backbones.stages``). The reference is the op's dense ``impl='reference'`` in float64 up to
``--dense-tokens`` tokens and its ``impl='torch'`` path in float64 above (itself tested against the dense one), on the
same (rounded) inputs. Each row checks the output and the gradient of every input: float32 (TF32 off) within 1e-4 of the
reference's largest entry; float16 within 1e-2 and bfloat16 within 3e-2 in relative norm (bfloat16 rounds 8 times as
coarsely: a gradient that sums or cancels over the whole map, as RMT's per-head decay or normalized linear attention's
dq, loses about 1e-2 in bfloat16, the torch path included); then two runs must be bitwise equal. Every row catches its
own error and prints ``FAIL`` with it (the run goes on); exit status 1 if any row fails.

``--quick`` checks the stages of PPMA-T, RMT-T and MLLA-T at 224 x 224 (one image; every op, every dtype) and times
them at the configs' 64 images per GPU, 10 runs per row.

``--simulate CAP`` (80, 86, 89 or 90) sets ``MMPPMA_SIMULATE_CUDA=CAP`` and ``TRITON_INTERPRET=1`` (in a fresh
process: the kernels are made interpreted when first imported): CPU tensors take the CUDA code path of that
capability and the kernels run on Triton's interpreter, at tiny shapes. It proves the tool and the host logic
work; it measures no speed.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
from typing import Callable, Dict, Iterator, List, Optional, Tuple

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TOOLS))

DTYPES = ('fp32', 'fp16', 'bf16')
#: largest error per dtype: float32 of the reference's largest entry, half precision in relative norm
LIMITS = {'fp32': 1e-4, 'fp16': 1e-2, 'bf16': 3e-2}
# the ops of each attention kind of the shipped backbones (mmppma.models.backbones.stages); the linear stages also
# run the scans
KIND_OPS = {
    'whole': ('ppma_attention', 'path_decay_tables'),
    'cc': ('criss_cross_attention', ),
    'manhattan': ('manhattan_attention', ),
    'rmt_cc': ('rmt_criss_cross_attention', ),
    'linear': ('ppma_linear_attention', 'ppma_decomposed_attention', 'polyline_mask_matvec', 'decay_scan_1d'),
}
# (B, heads, H, W, d) per kind on the simulated device (the interpreter runs a program at a time): odd sizes,
# whole attention over two ragged blocks, d = 8 padded to the kernels' least tile of 16
TINY = {'whole': (1, 2, 4, 5, 16), 'cc': (1, 2, 5, 6, 16), 'manhattan': (1, 2, 4, 5, 16),
        'rmt_cc': (1, 2, 5, 6, 16), 'linear': (1, 2, 5, 6, 8)}
# the 3-D mask's matvec: no shipped backbone uses it; (B, heads, D, H, W, C): at a GPU's and at the tiny shapes
MATVEC_3D = (1, 2, 3, 8, 10, 16)
MATVEC_3D_TINY = (1, 1, 3, 4, 5, 8)
# --quick: these input sizes and backbones of mmppma.models.backbones.stages
QUICK_SHAPES = ('cls_224', )
QUICK_MODELS = ('ppma_t', 'rmt_t', 'mlla_t')
QUICK_REPEATS = 10


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--shapes', nargs='+',
                        help='input sizes of mmppma.models.backbones.stages.IMAGES (default: all)')
    parser.add_argument('--models', nargs='+',
                        help='backbones of mmppma.models.backbones.stages.SHIPPED (default: all)')
    parser.add_argument('--dtype', nargs='+', choices=DTYPES, default=list(DTYPES))
    parser.add_argument('--batch', type=int, default=1, help='images per shape (default 1)')
    parser.add_argument('--speed-batch', type=int,
                        help='images per shape in the speed table (default: --batch; with --quick: the configs\' '
                             'images per GPU)')
    parser.add_argument('--quick', action='store_true',
                        help=f'{", ".join(QUICK_SHAPES)} of {", ".join(QUICK_MODELS)}, every dtype, '
                             f'{QUICK_REPEATS} timed runs per speed row')
    parser.add_argument('--dense-tokens', type=int, default=4096,
                        help='largest H * W checked against the dense reference (default 4096)')
    parser.add_argument('--no-speed', action='store_true', help='skip the speed table')
    parser.add_argument('--repeats', type=int, help='timed runs per speed row (median; default 20, --quick 10)')
    parser.add_argument('--simulate', type=int, choices=(80, 86, 89, 90, 100, 120),
                        help='no GPU: run the CUDA code path of this capability on CPU tensors (interpreted)')
    parser.add_argument('--json', help='also write the rows to this file')
    args = parser.parse_args(argv)
    if args.quick and (args.shapes or args.models):
        parser.error('--quick chooses the shapes and models: leave out --shapes and --models, or --quick')
    if args.quick and not args.simulate:
        args.shapes, args.models = list(QUICK_SHAPES), list(QUICK_MODELS)
    args.repeats = args.repeats or (QUICK_REPEATS if args.quick else 20)
    return args


def shapes_to_check(args, speed: bool = False) -> List[Tuple[str, str, tuple]]:
    """(label, kind, (B, heads, H, W, d)) of every attention stage to check (``speed``: to time)."""
    if args.simulate:
        if args.shapes or args.models or args.batch != 1 or args.speed_batch:
            raise SystemExit('gpu_check: --simulate runs tiny shapes on the CPU; --shapes, --models, --batch and '
                             '--speed-batch choose the shapes on a GPU: leave them out, or leave out --simulate')
        return [(f'tiny/{kind}', kind, shape) for kind, shape in TINY.items()]
    from mmppma.models.backbones.stages import IMAGES, SHIPPED, model_shapes
    unknown = sorted(set(args.shapes or ()) - set(IMAGES)) + sorted(set(args.models or ()) - set(SHIPPED))
    if unknown:
        raise SystemExit(f'gpu_check: unknown shape or model {unknown}; the shapes are '
                         f'{", ".join(IMAGES)}, the models {", ".join(SHIPPED)}')
    rows = model_shapes(args.shapes or list(IMAGES), args.models or list(SHIPPED))
    batch = args.batch
    if speed:
        batch = args.speed_batch or (None if args.quick else args.batch)
    return [(label, kind, shape if batch is None else (batch, *shape[1:])) for label, kind, shape in rows]


def make_case(op: str, shape: tuple, device, dtype, seed: int = 0) -> Tuple[Callable, List]:
    """(call(*inputs, impl) -> output, inputs): random inputs of ``op`` at ``shape`` (log-decays <= 0)."""
    import torch

    from mmppma import ops
    g = torch.Generator().manual_seed(seed)

    meta = torch.device(device).type == 'meta'  # no data: the launches only (tools/gpu_report.py's budget)

    def randn(*s, scale=1.0):
        if meta:
            return torch.empty(*s, device=device, dtype=dtype)
        return (torch.randn(*s, generator=g) * scale).to(device=device, dtype=dtype)

    def decay(*s):
        if meta:
            return torch.empty(*s, device=device)
        return (-torch.rand(*s, generator=g) * 0.5).to(device)

    if op == 'polyline_mask_matvec_3d':
        b, heads, dd, h, w, c = shape
        return (lambda x, la, lb, lc, impl: ops.polyline_mask_matvec_3d(x, la, lb, lc, impl=impl),
                [randn(*shape), decay(b, heads, dd, h, w), decay(b, heads, dd, h, w), decay(b, heads, dd, h, w)])
    b, heads, h, w, d = shape
    qkv = [randn(b, heads, h, w, d, scale=0.5) for _ in range(3)]
    tables = [decay(b, heads, h, w), decay(b, heads, h, w)]
    scale = d**-0.5
    if op in ('ppma_attention', 'criss_cross_attention'):
        fn = getattr(ops, op)
        return (lambda q, k, v, la, lb, impl: fn(q, k, v, la, lb, scale=scale, impl=impl)), qkv + tables
    if op in ('manhattan_attention', 'rmt_criss_cross_attention'):
        fn = getattr(ops, op)
        log_decay = torch.log1p(-torch.rand(heads, generator=g) * 0.5).to(device)
        return (lambda q, k, v, ld, impl: fn(q, k, v, ld, scale=scale, impl=impl)), qkv + [log_decay]
    if op == 'ppma_linear_attention':
        return (lambda q, k, v, la, lb, impl: ops.ppma_linear_attention(
            q, k, v, la, lb, feature_map='elu', normalize=True, impl=impl)), qkv + tables
    if op == 'ppma_decomposed_attention':
        return (lambda s1, s2, v, la, lb, impl: ops.ppma_decomposed_attention(s1, s2, v, la, lb, impl=impl),
                qkv + tables)
    if op == 'polyline_mask_matvec':
        return (lambda x, la, lb, impl: ops.polyline_mask_matvec(x, la, lb, form='2d', impl=impl),
                qkv[:1] + tables)
    if op == 'path_decay_tables':  # the decay head of a layer of ``heads`` heads of d channels, stacked tables
        params = [torch.randn(2, d, generator=g).to(device), torch.randn(heads, generator=g).to(device),
                  torch.rand(heads, generator=g).to(device)]
        return (lambda x, w_, bias, a_log, impl: torch.stack(ops.path_decay_tables(x, w_, bias, a_log, impl=impl)),
                [randn(b, h, w, heads * d)] + params)
    if op == 'decay_scan_1d':  # along the image rows, as the linear attention scans them
        return (lambda x, ld, impl: ops.decay_scan_1d(x, ld, impl=impl), qkv[:1] + tables[:1])
    raise KeyError(op)


def forward_backward(call, inputs, impl, cotangent=None):
    """The output and the gradient of every input for the cotangent (random, fixed by the output's shape)."""
    import torch
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = call(*leaves, impl)
    if cotangent is None and out.device.type == 'meta':
        cotangent = torch.empty_like(out)
    elif cotangent is None:
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    grads = torch.autograd.grad(out, leaves, cotangent.to(out.dtype), allow_unused=True)
    return [out.detach()] + [torch.zeros_like(t) if gr is None else gr for t, gr in zip(leaves, grads)], cotangent


def error(got, want, half: bool) -> float:
    """Relative norm error (half precision) or max error over the reference's largest entry (float32)."""
    got, want = got.double(), want.double()
    if half:
        return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def check_row(op, label, shape, dtype_name, device, dense_tokens) -> Dict:
    import torch
    dtype = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}[dtype_name]
    call, inputs = make_case(op, shape, device, dtype)
    got, cotangent = forward_backward(call, inputs, 'triton')
    again, _ = forward_backward(call, inputs, 'triton', cotangent)
    tokens = shape[2] * shape[3] * (shape[4] if op == 'polyline_mask_matvec_3d' else 1)
    ref_impl = 'reference' if tokens <= dense_tokens else 'torch'
    want, _ = forward_backward(call, [t.double() for t in inputs], ref_impl, cotangent.double())
    half = dtype != torch.float32
    errors = [error(g, w, half) for g, w in zip(got, want)]
    limit = LIMITS[dtype_name]
    finite = all(torch.isfinite(t).all().item() for t in got)
    deterministic = all(torch.equal(a, b) for a, b in zip(got, again))
    ok = finite and deterministic and max(errors) <= limit
    return dict(op=op, shape=label, size=list(shape), dtype=dtype_name, reference=ref_impl, out_error=errors[0],
                grad_error=max(errors[1:]), limit=limit, deterministic=deterministic, finite=finite, ok=ok)


def event_ms(fn) -> float:
    """Milliseconds of one call of ``fn`` on the GPU, by CUDA events."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def time_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    return statistics.median(event_ms(fn) for _ in range(repeats))


def speed_row(op, label, shape, dtype_name, repeats, device='cuda', timer=None) -> Dict:
    """Forward and forward + backward of the op's kernels against SDPA on (B, heads, H * W, d) (its flash backend
    on a GPU), each the median of ``timer(fn, repeats)`` (default :func:`time_ms`: CUDA events)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}[dtype_name]
    timer = timer or time_ms
    call, inputs = make_case(op, shape, device, dtype)
    leaves = [t.requires_grad_() for t in inputs]
    b, heads, h, w, d = shape
    flat = [torch.randn(b, heads, h * w, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3)]
    on_gpu = torch.device(device).type == 'cuda'

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if on_gpu else contextlib.nullcontext():
            return F.scaled_dot_product_attention(*flat)

    def both(fn):
        def run():
            out = fn()
            out.backward(torch.ones_like(out))
        return run

    ours = lambda: call(*leaves, 'triton')  # noqa: E731
    row = dict(op=op, shape=label, dtype=dtype_name)
    for key, fn in (('ms_fwd', ours), ('ms_fwd_bwd', both(ours)), ('sdpa_ms_fwd', sdpa),
                    ('sdpa_ms_fwd_bwd', both(sdpa))):
        with torch.no_grad() if key.endswith('fwd') else torch.enable_grad():
            row[key] = timer(fn, repeats)
    return row


def guarded(fn, row: Dict, *args) -> Tuple[Dict, str]:
    """(row, '') from ``fn(*args)``, or, if it raises, (``row`` marked failed with the error, the error's line):
    one failing row does not stop the run."""
    try:
        return dict(ok=True) | fn(*args), ''
    except Exception as e:  # noqa: BLE001  (any error is this row's result)
        lines = str(e).strip().splitlines()
        message = f'{type(e).__name__}: {lines[0] if lines else ""}'
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # an out-of-memory row leaves the next ones room
        return dict(row, ok=False, error=message), message


@contextlib.contextmanager
def simulated(cap: Optional[int], tool: str = 'gpu_check') -> Iterator[None]:
    """Within the block: the simulated device of capability ``cap`` (None: nothing), the kernels interpreted; the
    caller's settings after it (``main`` may run in a caller's process)."""
    saved = {name: os.environ.get(name) for name in ('MMPPMA_SIMULATE_CUDA', 'TRITON_INTERPRET')}
    if cap:
        interpreted = os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')
        if not interpreted and any(name.endswith('.triton_impl') for name in sys.modules):
            raise SystemExit(f'{tool}: --simulate needs the kernels interpreted, but they were imported compiled; '
                             'run it in a fresh process')
        os.environ.update(MMPPMA_SIMULATE_CUDA=str(cap), TRITON_INTERPRET='1')
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def environment(simulate: Optional[int]) -> Iterator[None]:
    """Within the block: the simulated device's variables (``--simulate``) and float32 products without TF32."""
    with simulated(simulate):
        from mmppma.ops.triton_support.launch import tf32_matmuls
        with tf32_matmuls(False):  # float32 rows are checked against exact products
            yield


def main(argv=None) -> int:
    args = parse_args(argv)
    with environment(args.simulate):
        return run_checks(args)


def run_checks(args) -> int:
    import torch
    import triton
    if not args.simulate and not torch.cuda.is_available():
        print('gpu_check: no CUDA device here; run on a GPU machine, or pass --simulate 90 to check the CUDA code '
              'path on CPU', file=sys.stderr)
        return 2
    device = 'cpu' if args.simulate else 'cuda'
    where = (f'simulated sm_{args.simulate} (CPU tensors, kernels interpreted)' if args.simulate else
             f'{torch.cuda.get_device_name()} (sm_{"".join(map(str, torch.cuda.get_device_capability()))})')
    print(f'gpu_check on {where}; torch {torch.__version__}, triton {triton.__version__}', flush=True)

    def with_3d(shapes):
        cases = [(op, label, shape) for label, kind, shape in shapes for op in KIND_OPS[kind]]
        return cases + [('polyline_mask_matvec_3d', '3d', MATVEC_3D_TINY if args.simulate else MATVEC_3D)]

    rows, failed = [], 0
    print(f'{"op":<27} {"shape":<34} {"dtype":<5} {"ref":<9} {"out err":>9} {"grad err":>9} {"limit":>6}  '
          f'determ.  status', flush=True)
    for op, label, shape in with_3d(shapes_to_check(args)):
        for dtype_name in args.dtype:
            row, message = guarded(check_row, dict(op=op, shape=label, size=list(shape), dtype=dtype_name),
                                   op, label, shape, dtype_name, device, args.dense_tokens)
            rows.append(row)
            failed += not row['ok']
            if message:
                print(f'{op:<27} {label:<34} {dtype_name:<5} FAIL  {message}', flush=True)
                continue
            print(f'{op:<27} {label:<34} {dtype_name:<5} {row["reference"]:<9} {row["out_error"]:>9.2e} '
                  f'{row["grad_error"]:>9.2e} {row["limit"]:>6.0e}  '
                  f'{"yes" if row["deterministic"] else "NO":<7}  {"ok" if row["ok"] else "FAIL"}', flush=True)
    speed = []
    half = [d for d in args.dtype if d != 'fp32']  # flash SDPA takes half precision only
    if args.simulate or args.no_speed or not half:
        why = 'simulated device' if args.simulate else '--no-speed' if args.no_speed else 'flash SDPA takes fp16 / bf16'
        print(f'speed: not measured ({why})')
    else:
        print(f'\n{"op":<27} {"shape":<34} {"dtype":<5} {"fwd ms":>8} {"sdpa":>8} {"fwd+bwd ms":>10} {"sdpa":>8}')
        for op, label, shape in with_3d(shapes_to_check(args, speed=True))[:-1]:
            for dtype_name in half:
                row, message = guarded(speed_row, dict(op=op, shape=label, size=list(shape), dtype=dtype_name),
                                       op, label, shape, dtype_name, args.repeats)
                speed.append(row)
                failed += not row['ok']
                label_ = f'{label}@{shape[0]}'
                if message:
                    print(f'{op:<27} {label_:<34} {dtype_name:<5} FAIL  {message}', flush=True)
                    continue
                print(f'{op:<27} {label_:<34} {dtype_name:<5} {row["ms_fwd"]:>8.3f} {row["sdpa_ms_fwd"]:>8.3f} '
                      f'{row["ms_fwd_bwd"]:>10.3f} {row["sdpa_ms_fwd_bwd"]:>8.3f}', flush=True)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(device=where, checks=rows, speed=speed), f, indent=1)
    total = len(rows) + len(speed)
    print(f'{total - failed} of {total} rows passed' + (f'; {failed} FAILED' if failed else ''))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
