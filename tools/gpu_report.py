#!/usr/bin/env python
"""Every GPU figure of docs/gpu_runs.md in one process, the rows that matter first, under one deadline.

    python tools/gpu_report.py DIR [--release-dir RELEASE] [--deadline 420] [--limit STEP=SECONDS ...]
    python tools/gpu_report.py --plan                 # the compile budget of a run on sm_90, on any machine
    python tools/gpu_report.py DIR --simulate 90      # the rehearsal: simulated device, eager, smallest shapes
    python tools/gpu_report.py --build-triton-cache CACHE   # our kernels of a run, compiled for sm_90 here
    python tools/gpu_report.py --check-triton-cache CACHE   # replay a run through Triton's JIT: all cache hits?
    TRITON_CACHE_DIR=CACHE python tools/gpu_report.py DIR   # on the card: the kernels found there load, no compile

The process imports once, builds each model once per configuration and runs every benchmark in-process. The
steps, in order of value (:data:`STEPS`, each with its own time limit):

1. ``card``: the GPU, its driver, torch and triton;
2. ``gpu_check``: ``tools/gpu_check.py --quick`` row by row, every op with a kernel and every dtype against float64,
   output and gradients (the first shape of every op before the second ones), then speed at the configs' 64 images;
3. ``cls_infer_b64``: the classification trunk (``tools/benchmark_model.py --task classifier``), 224 x 224, batch 64,
   bf16 inference: PPMA-T and RMT-T with the kernels, PPMA-T on the torch path, the release's PPMA-T and RMT-T
   (``--release-dir``: a folder with the release's ``classification/models/PPMA.py`` and ``RMT.py``);
4. ``cls_train_b64``: the same trunks' training step (forward, backward, AdamW), ours and the release's;
5. ``ops_800x1344``: the ops at Mask R-CNN's 800 x 1344, 2 images, bf16, forward and forward + backward, against
   flash SDPA without a mask over the same tokens (``gpu_check``'s baseline), and whole attention at stage 3
   against FlexAttention with the same bias from the tables (``tools/benchmark_ops.py``'s baseline);
6. ``cuda_graphs_b64``: ``torch.compile(mode='reduce-overhead')`` inference of PPMA-T and RMT-T (step 3's models)
   beside their eager rows;
7. ``linear_train_b64``: PPMLA-T against MLLA-T, step 4's training step;
8. ``backbone_800x1344``: the backbones alone at 800 x 1344, batch 2, a training step (forward, backward), PPMA-T
   against RMT-T.

Each row is printed and appended to ``DIR/rows.jsonl`` the moment it is measured (flushed): a run that is cut
keeps every finished row. One JSON object per line, ``kind`` one of ``plan`` (the compile budget), ``row``,
``step`` (a step's status: ``ok``, ``failed`` (its rows or the step itself), ``cut``, ``not started``) and
``summary``, the last line. The run has one deadline (``--deadline``, default 420 s) and each step a limit
(``--limit STEP=SECONDS``; by default :data:`STEPS`' seconds plus the step's expected compile seconds); steps
check both between iterations (a compile in progress finishes first), a step
past its limit says so and the run goes on with the next; past the deadline the remaining steps are not started.
The summary (also ``DIR/summary.txt``) lists every step with its status.

The compile budget, printed first (and with ``--plan`` alone): per step, the Triton specializations of our kernels
that it compiles that no earlier step did, found by recording the ops' launches on ``meta`` tensors for the card's
capability (as ``tools/check_kernels.py`` does, at the ops' stage shapes of the step's models), keyed as Triton's
JIT keys them; their expected seconds from :data:`COMPILE_SECONDS` (per kernel, compiled for sm_90 with triton
3.6.0 on a 2-core CPU by ``--build-triton-cache``, which prints them); and the inductor graphs it compiles,
counted apart (their seconds are known only from a GPU run: the rows' ``first_s``).

``--simulate CAP`` runs the report on the simulated device (``MMPPMA_SIMULATE_CUDA=CAP``, the kernels on Triton's
interpreter, CPU tensors), eager only, every step at its smallest shape (:data:`REHEARSAL`): it proves the steps,
the limits and the files, and measures no speed.

A Triton cache built here serves the card when it holds the JIT's own keys (the triton wheel's hash, the kernel's
source and specialization, ptxas and target, the options): ``--build-triton-cache`` compiles every launch of a run
through the JIT's own path with a stand-in driver for the card, keeps what a hit reads (metadata and cubin) and
replays the launches from the folder; a run rewrites the folder's group files (absolute paths) to where it is.

The models' steps need mmengine and mmpretrain (not mmcv); on a machine with only torch and triton, from a folder
of their wheels: ``pip install --no-deps --no-index --find-links WHEELS mmengine==0.10.7 mmpretrain==1.2.0``
(``--target DIR`` and ``PYTHONPATH=DIR`` without write access to site-packages); the run prints that line when
they are missing.
"""
import argparse
import contextlib
import importlib.util
import json
import os
import os.path as osp
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Callable, Dict, Iterator, List, Optional

TOOLS = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(TOOLS)
sys.path.insert(0, ROOT)
sys.path.insert(0, TOOLS)

#: (step, default limit in seconds besides its expected Triton compiles), in the order they run
STEPS = (('card', 15), ('gpu_check', 120), ('cls_infer_b64', 60), ('cls_train_b64', 60), ('ops_800x1344', 60),
         ('cuda_graphs_b64', 90), ('linear_train_b64', 40), ('backbone_800x1344', 40))
DEADLINE = 420
#: the sizes of a run on a GPU, and of the rehearsal on the simulated device (each step at its smallest shape)
REAL = dict(cls_shape=(224, 224), cls_batch=64, iters=20, amp='bf16', check_dtypes=('fp32', 'fp16', 'bf16'),
            ops=None, det_image='det_800x1344', det_batch=2, op_dtype='bf16', op_repeats=10, warmup=1,
            backbone_shape=(800, 1344), backbone_batch=2, backbone_iters=5, model_impl=None)
#: the rehearsal checks and times one op only, the cheapest on Triton's interpreter, and runs the models on the torch
#: path (a whole model on the interpreter takes minutes; the kernels' simulated path is in that op's rows)
REHEARSAL = dict(cls_shape=(32, 32), cls_batch=2, iters=1, amp=None, check_dtypes=('fp32', ),
                 ops=('path_decay_tables', ), det_image=None, det_batch=1, op_dtype='fp32', op_repeats=1, warmup=0,
                 backbone_shape=(32, 32), backbone_batch=2, backbone_iters=1, model_impl='torch')
#: the ops each attention kind of a backbone runs (PPMA's learned decays: their tables from the layer's tokens)
MODEL_OPS = {'whole': ('ppma_attention', 'path_decay_tables'), 'cc': ('criss_cross_attention', 'path_decay_tables'),
             'manhattan': ('manhattan_attention', ), 'rmt_cc': ('rmt_criss_cross_attention', ),
             'linear': ('ppma_linear_attention', )}
#: step 5's ops, whole attention first
OP_ORDER = ('ppma_attention', 'manhattan_attention', 'criss_cross_attention', 'rmt_criss_cross_attention',
            'path_decay_tables')
#: seconds to compile one specialization of each kernel for sm_90 with triton 3.6.0 on a 2-core CPU shared with
#: other jobs (median over the 204 specializations of a run, through the JIT: ``--build-triton-cache`` prints
#: them); a kernel missing here counts DEFAULT_SECONDS
COMPILE_SECONDS: Dict[str, float] = {'_line_bwd': 1.71, '_line_fwd': 0.85, '_ppmla_bwd': 0.76, '_ppmla_fwd': 0.55,
                                     '_scan_kernel': 0.22, '_tables_bwd': 0.48, '_tables_fwd': 0.33,
                                     '_whole_bwd': 3.46, '_whole_fwd': 1.0}
DEFAULT_SECONDS = 2.0
#: the models of the model steps: (step, task, models, impls, train); 'release': the release's model
CLS_MODELS = {'cls_infer_b64': [('PPMA', 'auto'), ('RMT', 'auto'), ('PPMA', 'torch'), ('PPMA', 'release'),
                                ('RMT', 'release')],
              'cls_train_b64': [('PPMA', 'auto'), ('RMT', 'auto'), ('PPMA', 'release'), ('RMT', 'release')],
              'cuda_graphs_b64': [('PPMA', 'auto'), ('RMT', 'auto')],
              'linear_train_b64': [('PPMLA', 'auto'), ('MLLA', 'auto')]}


class Cut(BaseException):
    """A step past its limit or the run past its deadline (a BaseException: rows that catch their own errors let
    it through). ``partial``: the row measured so far, if any."""

    def __init__(self, message: str, partial: Optional[dict] = None):
        super().__init__(message)
        self.partial = partial


class Clock:
    """The run's deadline and the current step's limit; :meth:`check` raises :class:`Cut` past either."""

    def __init__(self, deadline: float, now: Callable[[], float] = time.monotonic):
        self.now = now
        self.start = now()
        self.deadline = deadline
        self.end = self.start + deadline
        self.limit = deadline
        self.step_end = self.end

    def begin(self, limit: float) -> None:
        self.limit = limit
        self.step_end = min(self.now() + limit, self.end)

    def over(self) -> bool:
        return self.now() >= self.end

    def check(self) -> None:
        now = self.now()
        if now >= self.end:
            raise Cut(f'the run is past its deadline of {self.deadline:g} s')
        if now >= self.step_end:
            raise Cut(f'past its limit of {self.limit:g} s')


class Report:
    """Rows to ``DIR/rows.jsonl`` (one JSON object a line, flushed as written) and to stdout."""

    def __init__(self, folder: str):
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.path = osp.join(folder, 'rows.jsonl')
        self.file = open(self.path, 'w')

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, default=str) + '\n')
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0], epilog='steps: ' + ', '.join(
        f'{name} ({seconds} s)' for name, seconds in STEPS))
    parser.add_argument('dir', nargs='?', help='folder for rows.jsonl and summary.txt')
    parser.add_argument('--release-dir', metavar='RELEASE',
                        help="a folder with the release's PPMA.py and RMT.py (classification/models/): adds their rows")
    parser.add_argument('--deadline', type=float, default=DEADLINE, help=f'seconds for the run (default {DEADLINE})')
    parser.add_argument('--limit', action='append', default=[], metavar='STEP=SECONDS',
                        help='a step\'s limit instead of its default (repeatable)')
    parser.add_argument('--simulate', type=int, choices=(80, 86, 89, 90, 100, 120),
                        help='the rehearsal: no GPU, the CUDA code path of this capability on CPU tensors, eager, '
                             'the smallest shapes')
    parser.add_argument('--plan', action='store_true', help='print the compile budget of a run on sm_90 and exit')
    parser.add_argument('--build-triton-cache', metavar='CACHE',
                        help='compile our kernels of a run for sm_90 into this Triton cache folder, print each '
                             "kernel's median compile seconds, keep the cubins and check that the JIT hits them")
    parser.add_argument('--check-triton-cache', metavar='CACHE',
                        help="replay a run's launches through Triton's JIT with this cache folder: all must hit")
    args = parser.parse_args(argv)
    if args.plan or args.build_triton_cache or args.check_triton_cache:
        if args.dir or args.simulate or args.release_dir:
            parser.error('--plan and the Triton cache options run no step: leave out DIR, --simulate and '
                         '--release-dir')
    elif not args.dir:
        parser.error('DIR is required: the folder for rows.jsonl and summary.txt')
    if not args.deadline > 0:
        parser.error(f'--deadline must be a positive number of seconds, not {args.deadline:g}')
    args.limits, args.explicit = dict(STEPS), set()
    for item in args.limit:
        name, sep, value = item.partition('=')
        if not sep or name not in args.limits:
            parser.error(f'--limit takes STEP=SECONDS with STEP one of {", ".join(args.limits)}; got {item!r}')
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0:
            parser.error(f'--limit {name}: the seconds must be a number >= 0, not {value!r}')
        args.limits[name] = seconds
        args.explicit.add(name)
    if args.release_dir:
        missing = [f for f in ('PPMA.py', 'RMT.py') if not osp.isfile(osp.join(args.release_dir, f))]
        if missing:
            parser.error(f'--release-dir {args.release_dir}: no {", ".join(missing)} there; put the release\'s '
                         'classification/models/PPMA.py and RMT.py in it')
    return args


def install_line() -> str:
    with open(osp.join(ROOT, 'requirements.txt')) as f:
        pins = re.findall(r'^((?:mmengine|mmpretrain)==\S+)', f.read(), re.M)
    return 'pip install --no-deps --no-index --find-links WHEELS ' + ' '.join(pins)


# ---------------------------------------------------------------------------------------------------- the steps
class Context:
    """What the steps share: the arguments, sizes, device, clock and the models built so far."""

    def __init__(self, args, sizes: dict, device, clock: Clock):
        self.args, self.sizes, self.device, self.clock = args, sizes, device, clock
        self.simulated = bool(args.simulate)
        self.models: Dict[tuple, tuple] = {}
        self.rows: List[dict] = []  # every row written, for the summary's comparisons
        self.gpu_check = __import__('gpu_check')

    def model(self, name: str, impl: str, task: str, shape, batch: int):
        """(model, input, loss, seconds to build) of benchmark_model's build functions, built once per configuration."""
        if impl != 'release':
            impl = self.sizes['model_impl'] or impl
        key = (name, impl, task, tuple(shape), batch)
        if key not in self.models:
            import benchmark_model as bm
            import torch
            torch.manual_seed(0)
            ns = argparse.Namespace(worker=name, arch='tiny', impl=impl, batch=batch, shape=list(shape), task=task,
                                    release_dir=self.args.release_dir)
            build = bm.build_release if impl == 'release' else {'classifier': bm.build_classifier,
                                                                'backbone': bm.build_backbone}[task]
            start = time.perf_counter()
            self.models[key] = build(ns, self.device) + (time.perf_counter() - start, )
        return self.models[key]


def synchronize(device) -> None:
    if device.type == 'cuda':
        import torch
        torch.cuda.synchronize()


def time_model(ctx: Context, name: str, impl: str, task: str, train: bool, optimizer: bool, shape, batch: int,
               iters: int, compile_mode: Optional[str] = None) -> dict:
    """One model's step: the first (with its compiles; compiled: three warm-up steps), then ``iters`` timed ones,
    the clock checked between them. A cut after at least one timed step carries the row so far."""
    import torch
    from benchmark_model import amp_errors
    model, _, loss, build_s = ctx.model(name, impl, task, shape, batch)
    model.train(train)
    amp = {None: None, 'bf16': torch.bfloat16}[ctx.sizes['amp']]
    run = loss if compile_mode is None else torch.compile(loss, mode=compile_mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05) if optimizer else None
    device = ctx.device

    def step():
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            if train:
                run(True).backward()
                if opt is not None:
                    opt.step()
                model.zero_grad(set_to_none=True)
            else:
                with torch.inference_mode():
                    run(False)
        synchronize(device)

    row = dict(model=name + (' (release)' if impl == 'release' else ''), impl=impl, task=task,
               ran=impl if impl == 'release' else ctx.sizes['model_impl'] or impl,
               mode='train' if train else 'infer', optimizer=optimizer, compile=compile_mode or 'none',
               batch=batch, shape=list(shape), amp=ctx.sizes['amp'], build_s=build_s)
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    step()
    for _ in range(2 if compile_mode else 0):  # compiled: record the CUDA graphs, then replay them
        step()
    row['first_s'] = time.perf_counter() - start
    if device.type == 'cuda':
        row['peak_mib'] = (torch.cuda.max_memory_allocated() - base) / 2**20
    times = []

    def result():
        median = statistics.median(times)
        return dict(row, iters=len(times), ms=1e3 * median, images_per_s=batch / median)

    for _ in range(iters):
        try:
            ctx.clock.check()
        except Cut as cut:
            cut.partial = dict(result(), cut=True) if times else None
            raise
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    row = result()
    if amp is not None and not train and compile_mode is None:
        row['amp_error'] = amp_errors(model, loss, amp)
    return row


def model_rows(ctx: Context, step: str, task: str, train: bool, optimizer: bool, shape, batch: int, iters: int,
               compile_mode: Optional[str] = None) -> Iterator[dict]:
    for name, impl in CLS_MODELS[step] if task == 'classifier' else [('PPMA', 'auto'), ('RMT', 'auto')]:
        if impl == 'release' and not ctx.args.release_dir:
            yield dict(model=f'{name} (release)', impl=impl, skipped='no --release-dir')
            continue
        yield guarded(ctx, lambda: time_model(ctx, name, impl, task, train, optimizer, shape, batch, iters,
                                              compile_mode), dict(model=name, impl=impl))


def guarded(ctx: Context, fn: Callable[[], dict], row: dict) -> dict:
    """``fn()``, or ``row`` failed with the error's first line (a :class:`Cut` passes through)."""
    result, message = ctx.gpu_check.guarded(fn, row)
    return result


def step_card(ctx: Context) -> Iterator[dict]:
    import torch
    import triton
    row = dict(torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
               cpus=os.cpu_count())
    if ctx.simulated:
        row['device'] = f'simulated sm_{ctx.args.simulate} (CPU tensors, kernels interpreted)'
    else:
        props = torch.cuda.get_device_properties(0)
        row.update(device=props.name, capability='sm_%d%d' % (props.major, props.minor),
                   memory_mib=props.total_memory // 2**20, cuda=torch.version.cuda)
        try:
            smi = subprocess.run(['nvidia-smi', '--query-gpu=driver_version,clocks.max.sm', '--format=csv,noheader'],
                                 capture_output=True, text=True, timeout=10)
            row['driver'] = smi.stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            row['driver'] = f'nvidia-smi: {e}'
    yield row


def check_cases(ctx: Context) -> List[tuple]:
    """gpu_check --quick's (op, label, shape), the first shape of every op before its others."""
    gc = ctx.gpu_check
    args = gc.parse_args(['--quick'] + (['--simulate', str(ctx.args.simulate)] if ctx.simulated else []))
    cases = [(op, label, shape) for label, kind, shape in gc.shapes_to_check(args) for op in gc.KIND_OPS[kind]]
    cases.append(('polyline_mask_matvec_3d', '3d', gc.MATVEC_3D_TINY if ctx.simulated else gc.MATVEC_3D))
    seen, first, rest = set(), [], []
    for case in cases:
        (rest if case[0] in seen else first).append(case)
        seen.add(case[0])
    return first + rest


def speed_cases(ctx: Context) -> List[tuple]:
    gc = ctx.gpu_check
    args = gc.parse_args(['--quick'])
    return [(op, label, shape) for label, kind, shape in gc.shapes_to_check(args, speed=True)
            for op in gc.KIND_OPS[kind]]


def step_gpu_check(ctx: Context) -> Iterator[dict]:
    from mmppma.ops.triton_support.launch import tf32_matmuls
    gc = ctx.gpu_check
    device = 'cpu' if ctx.simulated else 'cuda'
    for op, label, shape in check_cases(ctx):
        if ctx.sizes['ops'] and op not in ctx.sizes['ops']:
            continue
        for dtype in ctx.sizes['check_dtypes']:
            with tf32_matmuls(False):  # float32 rows against exact products
                row, _ = gc.guarded(gc.check_row, dict(op=op, shape=label, size=list(shape), dtype=dtype),
                                    op, label, shape, dtype, device, 4096)
            yield dict(row, kind_of='check')
    if ctx.simulated:
        return
    for op, label, shape in speed_cases(ctx):
        for dtype in ('fp16', 'bf16'):
            row, _ = gc.guarded(op_speed, dict(op=op, shape=label, size=list(shape), dtype=dtype), ctx, op, label,
                                shape, dtype, QUICK_REPEATS)
            yield dict(row, kind_of='speed')


QUICK_REPEATS = 10


def time_ms(ctx: Context, fn: Callable, repeats: int) -> float:
    """Median milliseconds of ``fn`` after a warm-up call (the rehearsal: none; CUDA events on a GPU), the clock
    checked between runs."""
    for _ in range(ctx.sizes['warmup']):
        fn()
    times = []
    for _ in range(repeats):
        ctx.clock.check()
        if ctx.device.type == 'cuda':
            times.append(ctx.gpu_check.event_ms(fn))
        else:
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def op_speed(ctx: Context, op: str, label: str, shape: tuple, dtype_name: str, repeats: int) -> dict:
    """Forward and forward + backward of the op's kernels against SDPA on (B, heads, H * W, d): flash on a GPU
    (``gpu_check.speed_row``, timed by :func:`time_ms`)."""
    row = ctx.gpu_check.speed_row(op, label, shape, dtype_name, repeats, device=ctx.device,
                                  timer=lambda fn, count: time_ms(ctx, fn, count))
    return dict(row, size=list(shape))


def flex_speed(ctx: Context, label: str, shape: tuple, dtype_name: str, repeats: int) -> dict:
    """Whole attention as FlexAttention with the bias from the tables (benchmark_ops' baseline): the first call of
    each (its inductor compiles) and the medians."""
    import torch
    from benchmark_ops import whole_baseline
    dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}[dtype_name]
    _, inputs = ctx.gpu_check.make_case('ppma_attention', shape, ctx.device, dtype)
    leaves = [t.requires_grad_() for t in inputs]
    fn = whole_baseline('flex', *leaves, shape[-1]**-0.5)
    row = dict(op='ppma_attention (FlexAttention)', shape=label, size=list(shape), dtype=dtype_name)
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    synchronize(ctx.device)
    row['first_fwd_s'] = time.perf_counter() - start
    with torch.no_grad():
        row['ms_fwd'] = time_ms(ctx, fn, repeats)
    start = time.perf_counter()
    fn().float().sum().backward()
    synchronize(ctx.device)
    row['first_fwd_bwd_s'] = time.perf_counter() - start
    row['ms_fwd_bwd'] = time_ms(ctx, lambda: fn().float().sum().backward(), repeats)
    return row


def det_shapes(ctx: Context, models) -> List[tuple]:
    """(label, kind, shape) of the models' attention stages at step 5's size; the rehearsal: gpu_check's tiny ones."""
    if ctx.simulated:
        kinds = {'ppma_t': ('cc', 'whole'), 'rmt_t': ('rmt_cc', 'manhattan')}
        shapes = [(f'tiny/{kind}', kind, ctx.gpu_check.TINY[kind]) for m in models for kind in kinds[m]]
    else:
        from mmppma.models.backbones.stages import model_shapes
        shapes = model_shapes([ctx.sizes['det_image']], models, ctx.sizes['det_batch'])
    return shapes


def step_ops(ctx: Context) -> Iterator[dict]:
    shapes = det_shapes(ctx, ['ppma_t', 'rmt_t'])
    dtype, repeats = ctx.sizes['op_dtype'], ctx.sizes['op_repeats']
    for op in OP_ORDER:
        if ctx.sizes['ops'] and op not in ctx.sizes['ops']:
            continue
        for label, kind, shape in shapes:
            if op in ctx.gpu_check.KIND_OPS[kind]:
                row, _ = ctx.gpu_check.guarded(op_speed, dict(op=op, shape=label, dtype=dtype), ctx, op, label,
                                               shape, dtype, repeats)
                yield row
    whole = [(label, shape) for label, kind, shape in shapes if kind == 'whole'][:1]
    for label, shape in whole:
        if ctx.simulated:
            yield dict(op='ppma_attention (FlexAttention)', shape=label, skipped='simulated device: eager only')
            continue
        row, _ = ctx.gpu_check.guarded(flex_speed, dict(op='ppma_attention (FlexAttention)', shape=label), ctx,
                                       label, shape, dtype, repeats)
        yield row


def step_cls(ctx: Context, step: str, train: bool) -> Iterator[dict]:
    s = ctx.sizes
    yield from model_rows(ctx, step, 'classifier', train, train, s['cls_shape'], s['cls_batch'], s['iters'])


def step_cuda_graphs(ctx: Context) -> Iterator[dict]:
    if ctx.simulated:
        yield dict(model='PPMA, RMT', compile='reduce-overhead', skipped='simulated device: eager only')
        return
    s = ctx.sizes
    yield from model_rows(ctx, 'cuda_graphs_b64', 'classifier', False, False, s['cls_shape'], s['cls_batch'],
                          s['iters'], compile_mode='reduce-overhead')


def step_backbone(ctx: Context) -> Iterator[dict]:
    s = ctx.sizes
    yield from model_rows(ctx, 'backbone_800x1344', 'backbone', True, False, s['backbone_shape'],
                          s['backbone_batch'], s['backbone_iters'])


STEP_FUNCTIONS = {
    'card': step_card,
    'gpu_check': step_gpu_check,
    'cls_infer_b64': lambda ctx: step_cls(ctx, 'cls_infer_b64', False),
    'cls_train_b64': lambda ctx: step_cls(ctx, 'cls_train_b64', True),
    'ops_800x1344': step_ops,
    'cuda_graphs_b64': step_cuda_graphs,
    'linear_train_b64': lambda ctx: step_cls(ctx, 'linear_train_b64', True),
    'backbone_800x1344': step_backbone,
}


def row_text(row: dict) -> str:
    """One printed line per row."""
    if 'skipped' in row:
        what = row.get('model') or row.get('op')
        return f'{what} {row.get("shape", "")}: skipped ({row["skipped"]})'
    if row.get('error'):
        what = ' '.join(str(row[k]) for k in ('model', 'impl', 'op', 'shape', 'dtype') if k in row)
        return f'{what}: FAIL {row["error"]}'
    if 'out_error' in row:
        return (f'{row["op"]:<27} {row["shape"]:<30} {row["dtype"]:<5} {row["reference"]:<9} '
                f'{row["out_error"]:>9.2e} {row["grad_error"]:>9.2e} {row["limit"]:>6.0e} '
                f'{"yes" if row["deterministic"] else "NO":<4} {"ok" if row["ok"] else "FAIL"}')
    if 'ms_fwd' in row:
        sdpa = (f' | SDPA fwd {row["sdpa_ms_fwd"]:.3f} fwd+bwd {row["sdpa_ms_fwd_bwd"]:.3f} ms' if 'sdpa_ms_fwd' in row
                else f' | first calls {row["first_fwd_s"]:.1f} s, {row["first_fwd_bwd_s"]:.1f} s')
        return (f'{row["op"]:<27} {row["shape"]:<30} {row["dtype"]:<5} fwd {row["ms_fwd"]:.3f} fwd+bwd '
                f'{row["ms_fwd_bwd"]:.3f} ms{sdpa}')
    if 'ms' in row:
        memory = f', {row["peak_mib"]:.0f} MiB' if 'peak_mib' in row else ''
        amp = f', {row["amp"]} error {row["amp_error"][1]:.2g}' if row.get('amp_error') else ''
        return (f'{row["model"]:<16} {row["impl"]:<7} {row["mode"]:<5} compile={row["compile"]:<15} '
                f'{row["ms"]:9.2f} ms {row["images_per_s"]:9.1f} img/s{memory}, first {row["first_s"]:.1f} s'
                f'{amp}{" (cut: " + str(row["iters"]) + " steps)" if row.get("cut") else ""}')
    return ', '.join(f'{k} {v}' for k, v in row.items())


def row_failed(row: dict) -> bool:
    return row.get('ok') is False or bool(row.get('error'))


def run_steps(ctx: Context, report: Report, steps=None) -> List[dict]:
    """Every step in order under the clock; a status record per step."""
    statuses = []
    for name, _ in STEPS:
        if steps is not None and name not in steps:
            continue
        limit = ctx.args.limits[name]
        if ctx.clock.over():
            status = dict(kind='step', step=name, status='not started', seconds=0.0, rows=0, limit=limit,
                          message=f'the run is past its deadline of {ctx.clock.deadline:g} s')
            print(f'== {name}: not started ({status["message"]})', flush=True)
            report.write(status)
            statuses.append(status)
            continue
        print(f'== {name} (limit {limit:g} s, {ctx.clock.end - ctx.clock.now():.0f} s left in the run)', flush=True)
        ctx.clock.begin(limit)
        start = time.perf_counter()
        rows = failed = 0
        status, message = 'ok', ''

        def emit(row):
            nonlocal rows, failed
            record = dict(kind='row', step=name, **row)
            report.write(record)
            ctx.rows.append(record)
            print('  ' + row_text(row), flush=True)
            rows += 1
            failed += row_failed(row)

        try:
            for row in STEP_FUNCTIONS[name](ctx):
                emit(row)
                ctx.clock.check()
        except Cut as cut:
            if cut.partial:
                emit(cut.partial)
            status, message = 'cut', f'cut: {cut} (after {rows} rows)'
        except Exception as e:  # noqa: BLE001  (the step's own failure is its result; the run goes on)
            lines = str(e).strip().splitlines()
            status, message = 'failed', f'{type(e).__name__}: {lines[0] if lines else ""}'
        if status == 'ok' and failed:
            status, message = 'failed', f'{failed} of {rows} rows failed'
        record = dict(kind='step', step=name, status=status, seconds=round(time.perf_counter() - start, 2),
                      rows=rows, limit=limit, message=message)
        report.write(record)
        statuses.append(record)
        if status != 'ok':
            print(f'== {name}: {status.upper()} {message}', flush=True)
    return statuses


#: the summary's comparisons of model rows: (step, row a, step, row b), rows named by (model, impl)
COMPARED = [('cls_infer_b64', ('PPMA', 'auto'), 'cls_infer_b64', ('RMT', 'auto')),
            ('cls_infer_b64', ('PPMA', 'auto'), 'cls_infer_b64', ('PPMA (release)', 'release')),
            ('cls_infer_b64', ('PPMA', 'torch'), 'cls_infer_b64', ('PPMA (release)', 'release')),
            ('cls_train_b64', ('PPMA', 'auto'), 'cls_train_b64', ('RMT', 'auto')),
            ('cls_train_b64', ('PPMA', 'auto'), 'cls_train_b64', ('PPMA (release)', 'release')),
            ('cuda_graphs_b64', ('PPMA', 'auto'), 'cls_infer_b64', ('PPMA', 'auto')),
            ('cuda_graphs_b64', ('RMT', 'auto'), 'cls_infer_b64', ('RMT', 'auto')),
            ('linear_train_b64', ('PPMLA', 'auto'), 'linear_train_b64', ('MLLA', 'auto')),
            ('backbone_800x1344', ('PPMA', 'auto'), 'backbone_800x1344', ('RMT', 'auto'))]


def comparisons(rows: List[dict]) -> List[str]:
    """``a / b`` time ratios of the model rows both measured (:data:`COMPARED`)."""
    timed = {(r['step'], r.get('model'), r.get('impl')): r for r in rows if 'ms' in r}
    lines = []
    for step_a, a, step_b, b in COMPARED:
        ra, rb = timed.get((step_a, *a)), timed.get((step_b, *b))
        if ra and rb:
            lines.append(f'{step_a} {" ".join(a)} / {step_b} {" ".join(b)}: time {ra["ms"] / rb["ms"]:.2f}x')
    return lines


def summary_lines(statuses: List[dict], report_path: str, deadline: float, elapsed: float,
                  rows: List[dict] = ()) -> List[str]:
    lines = [f'== summary: {len(statuses)} steps in {elapsed:.0f} s of the deadline {deadline:g} s; rows in '
             f'{report_path}']
    for s in statuses:
        lines.append(f'{s["step"]:<18} {s["status"]:<12} {s["seconds"]:7.1f} s (limit {s["limit"]:g} s) '
                     f'{s["rows"]:3d} rows  {s["message"]}'.rstrip())
    return lines + comparisons(list(rows))


# --------------------------------------------------------------------------------------------- the compile plan
def _meta_ops(op: str, shape: tuple, dtype, train: bool) -> None:
    """Run ``op`` on meta tensors as gpu_check makes them: forward (no_grad) or forward and backward."""
    import torch
    from gpu_check import forward_backward, make_case
    call, inputs = make_case(op, shape, 'meta', dtype)
    if train:
        forward_backward(call, inputs, 'triton')
    else:
        with torch.no_grad():
            call(*inputs, 'triton')


def jit_key(launch, cap: int) -> tuple:
    """(kernel, signature, constexprs, attrs, options) of a launch as Triton's JIT specializes it for a GPU of
    capability ``cap``: each argument through triton's own specialization (integers equal to 1 become constexprs,
    booleans ``u1``, every pointer and integer argument gets an attribute entry, empty when not divisible by 16)."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl
    kernel = launch.kernel
    params = jit_function(kernel).params
    runtime = [p for p in params if p.name not in launch.constexprs]
    values = dict(zip([p.name for p in runtime], launch.args), **launch.constexprs)
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(params):
        value = values[p.name]
        if p.name in launch.constexprs or p.is_constexpr:
            signature[p.name] = 'constexpr'
            constexprs[(i, )] = value
            continue
        ty, spec = native_specialize_impl(CUDABackend, _Arg.of(value), False, not p.do_not_specialize,
                                          not p.do_not_specialize_on_alignment)
        signature[p.name] = ty
        if ty == 'constexpr':
            constexprs[(i, )] = spec
        elif isinstance(spec, str):
            attrs[(i, )] = CUDABackend.parse_attr(spec)
    options = dict(launch.options, debug=False, instrumentation_mode='')
    return (kernel, signature, constexprs, attrs, options, cap)


_JIT_FUNCTIONS: Dict[object, object] = {}


def jit_function(kernel):
    """The kernel's ``JITFunction``; under ``TRITON_INTERPRET=1`` (the rehearsal) the kernels are the interpreter's,
    and one is made from the same function and decorator options."""
    if hasattr(kernel, 'params'):
        return kernel
    if kernel not in _JIT_FUNCTIONS:
        from triton.runtime.jit import JITFunction
        names = ('do_not_specialize', 'do_not_specialize_on_alignment')
        options = {k: v for k, v in kernel.kwargs.items() if k in names}
        _JIT_FUNCTIONS[kernel] = JITFunction(kernel.fn, **options)
    return _JIT_FUNCTIONS[kernel]


class _Arg:
    """A tensor as Triton's specialization sees it: its dtype and its data pointer's alignment (allocations are
    aligned; the storage offset decides)."""

    def __init__(self, tensor):
        self.dtype = tensor.dtype
        self._ptr = tensor.storage_offset() * tensor.element_size()

    def data_ptr(self) -> int:
        return self._ptr

    @classmethod
    def of(cls, value):
        import torch
        return cls(value) if isinstance(value, torch.Tensor) else value


def key_text(key: tuple) -> str:
    kernel, signature, constexprs, attrs, options, cap = key
    return json.dumps([kernel.fn.__module__, kernel_name(kernel), signature, sorted(constexprs.items(), key=str),
                       sorted(attrs.items(), key=str), options, cap], default=str, sort_keys=True)


def plan_launches(cap: int) -> Dict[str, Dict[str, tuple]]:
    """Per step of a run on a GPU of capability ``cap``: {key text: (JIT key, a launch with that key)} of the Triton
    launches of our ops."""
    import torch

    from mmppma.models.backbones.stages import SHIPPED, model_shapes
    from mmppma.ops import plan
    from mmppma.ops.triton_support import launch as lp
    ctx = argparse.Namespace(simulated=False, gpu_check=__import__('gpu_check'), args=None)
    dtypes = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
    work: Dict[str, list] = {name: [] for name, _ in STEPS}
    for op, _, shape in check_cases(ctx):
        for dtype in REAL['check_dtypes']:
            work['gpu_check'].append((op, shape, dtype, True, False))
    for op, _, shape in speed_cases(ctx):
        for dtype in ('fp16', 'bf16'):
            work['gpu_check'] += [(op, shape, dtype, False, True), (op, shape, dtype, True, True)]

    def models(step, names, image, batch, train):
        # the kernel tools' tiny model of each variant that has kernels (MLLA, mask='none', launches none)
        tiny = {name: label for label, (name, arch) in SHIPPED.items() if arch == 'tiny'}
        labels = [tiny[n] for n in names if n in tiny]
        for _, kind, shape in model_shapes([image], labels, batch):
            for op in MODEL_OPS[kind]:
                work[step].append((op, shape, 'bf16', train, True))

    ours = lambda step: [n for n, impl in CLS_MODELS[step] if impl == 'auto']  # noqa: E731
    models('cls_infer_b64', ours('cls_infer_b64'), 'cls_224', REAL['cls_batch'], False)
    models('cls_train_b64', ours('cls_train_b64'), 'cls_224', REAL['cls_batch'], True)
    for _, kind, shape in model_shapes([REAL['det_image']], ['ppma_t', 'rmt_t'], REAL['det_batch']):
        for op in ctx.gpu_check.KIND_OPS[kind]:  # as step_ops times them
            work['ops_800x1344'] += [(op, shape, REAL['op_dtype'], False, True), (op, shape, REAL['op_dtype'], True,
                                                                                   True)]
    models('cuda_graphs_b64', ours('cuda_graphs_b64'), 'cls_224', REAL['cls_batch'], False)
    models('linear_train_b64', ours('linear_train_b64'), 'cls_224', REAL['cls_batch'], True)
    models('backbone_800x1344', ['PPMA', 'RMT'], REAL['det_image'], REAL['backbone_batch'], True)
    interpreted = plan.triton_interpreted
    plan.triton_interpreted = lambda: True  # impl='triton' takes meta tensors; nothing is launched
    try:
        result, recorded = {}, {}
        for step, items in work.items():
            keys = {}
            for item in items:
                if item not in recorded:  # the same op, shape, dtype and phase launch the same
                    op, shape, dtype, train, tf32 = item
                    with lp.tf32_matmuls(tf32), lp.recording(cap) as launches:
                        _meta_ops(op, shape, dtypes[dtype], train)
                    recorded[item] = [(key_text(key), key, launch) for launch in launches
                                      for key in [jit_key(launch, cap)]]
                for text, key, launch in recorded[item]:
                    keys.setdefault(text, (key, launch))
            result[step] = keys
    finally:
        plan.triton_interpreted = interpreted
    return result


#: inductor graphs each step compiles: step 5's FlexAttention at one whole-attention shape, two score_mods (the
#: two paths) each compiled for the forward without grad, the forward with grad and the backward; step 6 one
#: inference graph per model (the backbones trace without graph breaks: tests/models/test_compile.py)
INDUCTOR_GRAPHS = {'ops_800x1344': 6, 'cuda_graphs_b64': 2}


def compile_plan(cap: int = 90) -> List[dict]:
    """Per step: Triton specializations first compiled there (count, by kernel, expected seconds) and inductor
    graphs."""
    launches = plan_launches(cap)
    seen, plan = set(), []
    for name, _ in STEPS:
        new = {text: key for text, (key, _) in launches.get(name, {}).items() if text not in seen}
        seen.update(new)
        kernels = Counter(kernel_name(key[0]) for key in new.values())
        seconds = sum(COMPILE_SECONDS.get(k, DEFAULT_SECONDS) * n for k, n in kernels.items())
        plan.append(dict(kind='plan', step=name, triton=len(new), triton_seconds=round(seconds, 1),
                         kernels=dict(sorted(kernels.items())), inductor_graphs=INDUCTOR_GRAPHS.get(name, 0)))
    return plan


def plan_lines(plan: List[dict], cap: int) -> List[str]:
    total = sum(p['triton'] for p in plan)
    seconds = sum(p['triton_seconds'] for p in plan)
    graphs = sum(p['inductor_graphs'] for p in plan)
    lines = [f'compile budget of a run on sm_{cap}: {total} Triton specializations of our kernels, about '
             f'{seconds:.0f} s to compile (per kernel as triton 3.6.0 took on a 2-core CPU); '
             f'{graphs} inductor graphs (their seconds: the rows\' first_s)']
    for p in plan:
        lines.append(f'  {p["step"]:<18} {p["triton"]:3d} new specializations, {p["triton_seconds"]:6.1f} s; '
                     f'{p["inductor_graphs"]} inductor graphs')
    return lines


def kernel_name(kernel) -> str:
    return kernel.fn.__name__ if hasattr(kernel, 'fn') else kernel.__name__


@contextlib.contextmanager
def stand_in_driver(cap: int) -> Iterator[List[bool]]:
    """Within the block, Triton's JIT runs as on a GPU of capability ``cap`` up to its compile (a stand-in driver:
    device 0, stream 0, that target); the yielded list gets each compile's ``cache_hit``."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class StandIn:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget('cuda', cap, 32)

    hits: List[bool] = []
    listener, active = knobs.compilation.listener, driver._active
    knobs.compilation.listener = lambda **event: hits.append(event['cache_hit'])
    driver.set_active(StandIn())
    try:
        yield hits
    finally:
        driver._active = active  # reset_active() would look for a GPU driver
        knobs.compilation.listener = listener


def jit_warmup(launch) -> None:
    """Compile a launch through the JIT's own path (its specialization, cache key and cache), launching nothing."""
    launch.kernel.warmup(*[_Arg.of(a) for a in launch.args], grid=launch.grid, **launch.constexprs,
                         **launch.options)


def build_triton_cache(folder: str, cap: int = 90) -> int:
    """Compile every specialization of a run's :func:`plan_launches` for ``cap`` into the Triton cache ``folder``
    through the JIT's own path (a stand-in driver for the card), print each kernel's median seconds, keep only what
    a cache hit reads (each kernel's metadata and cubin), then :func:`check_triton_cache`."""
    if os.environ.get('TRITON_INTERPRET', '0') not in ('', '0'):
        raise SystemExit('gpu_report: --build-triton-cache compiles the kernels: unset TRITON_INTERPRET')
    os.environ['TRITON_CACHE_DIR'] = osp.abspath(folder)
    import triton
    launches = {}
    for step in plan_launches(cap).values():
        launches.update(step)
    print(f'{len(launches)} specializations, triton {triton.__version__}, sm_{cap}, into {folder}', flush=True)
    seconds: Dict[str, List[float]] = {}
    with stand_in_driver(cap) as events:
        for n, (key, launch) in enumerate(launches.values(), 1):
            before, start = len(events), time.perf_counter()
            jit_warmup(launch)
            took = time.perf_counter() - start
            seconds.setdefault(kernel_name(key[0]), []).append(took)
            how = 'compiled' if len(events) > before and not events[-1] else 'in the folder already' if len(
                events) > before else 'the same JIT key as an earlier launch'
            print(f'{n:4d} {kernel_name(key[0]):<22} {took:6.2f} s {how}', flush=True)
    medians = {k: round(statistics.median(v), 2) for k, v in sorted(seconds.items())}
    print(f'median seconds per kernel: {medians}')
    print(f'{len(launches)} specializations in {sum(map(sum, seconds.values())):.0f} s ({len(events)} JIT compiles); '
          f'{folder_mib(folder):.1f} MiB with every IR', flush=True)
    trim_triton_cache(folder)
    return check_triton_cache(folder, cap, launches)


def folder_mib(folder: str) -> float:
    return sum(osp.getsize(osp.join(d, f)) for d, _, files in os.walk(folder) for f in files) / 2**20


def groups(folder: str) -> Iterator[str]:
    """The group files of a Triton cache folder (one per compiled kernel: the paths of its files)."""
    for d, _, files in os.walk(folder):
        yield from (osp.join(d, f) for f in files if f.startswith('__grp__'))


def trim_triton_cache(folder: str) -> None:
    """Keep each kernel's metadata (``.json``) and binary (``.cubin``), what a cache hit reads; drop the IRs."""
    for path in groups(folder):
        with open(path) as f:
            children = json.load(f)['child_paths']
        kept = {c: p for c, p in children.items() if c.endswith(('.json', '.cubin'))}
        for c, p in children.items():
            if c not in kept and osp.exists(p):
                os.remove(p)
        with open(path, 'w') as f:
            json.dump(dict(child_paths=kept), f)


def relocate_triton_cache(folder: str) -> int:
    """Point every group of a Triton cache folder at its files where the folder is now (a group holds absolute
    paths, and a hit needs them to exist); the number of groups."""
    count = 0
    for path in groups(folder):
        with open(path) as f:
            children = json.load(f)['child_paths']
        here = {c: osp.join(osp.dirname(osp.abspath(path)), osp.basename(p)) for c, p in children.items()}
        if here != children:
            with open(path, 'w') as f:
                json.dump(dict(child_paths=here), f)
        count += 1
    return count


def check_triton_cache(folder: str, cap: int = 90, launches: Optional[dict] = None) -> int:
    """Replay every launch of a run through the JIT (stand-in driver) with ``folder`` as the cache: each must be a
    cache hit. Exit status 1 otherwise."""
    os.environ['TRITON_CACHE_DIR'] = osp.abspath(folder)
    relocate_triton_cache(folder)
    if launches is None:
        launches = {}
        for step in plan_launches(cap).values():
            launches.update(step)
    for _, launch in launches.values():
        jit_function(launch.kernel).device_caches.clear()  # the in-memory kernels: the replay reads the folder
    start = time.perf_counter()
    with stand_in_driver(cap) as events:
        for _, launch in launches.values():
            jit_warmup(launch)
    hits = sum(events)
    print(f'replayed through the JIT from {folder}: {hits} of {len(launches)} specializations were cache hits '
          f'({len(events) - hits} compiled), {time.perf_counter() - start:.1f} s; {folder_mib(folder):.1f} MiB')
    return 0 if hits == len(events) == len(launches) else 1


# -------------------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plan:
        plan = compile_plan(90)
        print('\n'.join(plan_lines(plan, 90)))
        return 0
    if args.build_triton_cache:
        return build_triton_cache(args.build_triton_cache)
    if args.check_triton_cache:
        return check_triton_cache(args.check_triton_cache)
    clock = Clock(args.deadline)
    import gpu_check  # tools/: on sys.path
    with gpu_check.simulated(args.simulate, 'gpu_report'):
        return run_report(args, clock)


def run_report(args, clock: Clock) -> int:
    import torch
    report = Report(args.dir)
    print(f'gpu_report: rows to {report.path} as measured; deadline {args.deadline:g} s', flush=True)
    missing = [name for name in ('mmengine', 'mmpretrain') if importlib.util.find_spec(name) is None]
    if missing:
        print(f'gpu_report: no {" or ".join(missing)} here; the model steps need mmengine and mmpretrain (not mmcv), '
              f'from a folder of their wheels: {install_line()}', flush=True)
    if not args.simulate and not torch.cuda.is_available():
        print('gpu_report: no CUDA device here; run on a GPU machine, or pass --simulate 90 for the rehearsal',
              file=sys.stderr)
        report.close()
        return 2
    cap = args.simulate or (lambda c: c[0] * 10 + c[1])(torch.cuda.get_device_capability())
    cache = os.environ.get('TRITON_CACHE_DIR')
    if cache and osp.isdir(cache) and not args.simulate:  # a cache built elsewhere (--build-triton-cache)
        print(f'Triton cache {cache}: {relocate_triton_cache(cache)} kernels; a specialization found there is '
              'loaded instead of compiled', flush=True)
    try:
        start = time.perf_counter()
        plan = compile_plan(cap)
        for p in plan:
            report.write(p)
        print('\n'.join(plan_lines(plan, cap)) + f'\n  (recorded in {time.perf_counter() - start:.1f} s)', flush=True)
        if args.simulate:
            print('  (simulated: the kernels run on the interpreter, nothing is compiled in this run)', flush=True)
        else:  # a step's default limit is for its work besides its expected compiles
            for p in plan:
                if p['step'] not in args.explicit:
                    args.limits[p['step']] += p['triton_seconds']
    except Exception as e:  # noqa: BLE001  (the budget is information; the run goes on without it)
        print(f'gpu_report: no compile budget ({type(e).__name__}: {e})', flush=True)
    ctx = Context(args, REHEARSAL if args.simulate else REAL, torch.device('cpu' if args.simulate else 'cuda'),
                  clock)
    statuses = run_steps(ctx, report)
    lines = summary_lines(statuses, report.path, args.deadline, clock.now() - clock.start, ctx.rows)
    report.write(dict(kind='summary', steps={s['step']: s['status'] for s in statuses},
                      seconds=round(clock.now() - clock.start, 1)))
    report.close()
    with open(osp.join(args.dir, 'summary.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    print('\n'.join(lines), flush=True)
    return 0 if all(s['status'] == 'ok' for s in statuses) else 1


if __name__ == '__main__':
    sys.exit(main())
