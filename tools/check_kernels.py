#!/usr/bin/env python
"""Compile every Triton kernel specialization the ops launch for a GPU target, without a GPU, and check it fits.

    python tools/check_kernels.py                          # default shapes, fp32/tf32/fp16/bf16, sm_80/86/89/90
    python tools/check_kernels.py --quick --arch 80 90     # reduced shape set (the CI check)
    python tools/check_kernels.py --arch 86 --dtype fp16 --shapes upernet_512 --jobs 2
    python tools/check_kernels.py --jobs 2 --write         # rewrite docs/generated/check_kernels.md

The launches are found by running the ops themselves (forward and backward, through ``impl='triton'``) on
``meta`` tensors while :func:`mmppma.ops.triton_support.launch.recording` collects them instead of launching: the same
code that picks tiles, warps and stages at run time, for the capability being checked. Each distinct
specialization is compiled by ``triton.compile`` for that target; ptxas's ``-v`` log gives registers and spill
bytes, the TTGIR the asynchronous copies of software-pipelined loops ('async': their count; 0 where no loop is
pipelined). Every input is also recorded at batch 1024 (the detection input included, without --quick), so that
each row's largest grid is checked against CUDA's limits. A row fails (exit status 1) if compiling fails, the
shared memory exceeds the target's per-block limit, anything spills, compiling takes longer than
``--max-seconds``, or a launch's grid passes CUDA's limits. Results are cached per specialization
(kernel source, arguments, target, triton version) in ``~/.cache/mmppma/check_kernels.json``.
"""
import argparse
import concurrent.futures
import contextlib
import hashlib
import io
import json
import os
import re
import sys
import time
from typing import Dict, List, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import triton  # noqa: E402

import mmppma.ops as ops  # noqa: E402
from mmppma.ops import dispatch  # noqa: E402
from mmppma.ops.triton_support import launch as lp  # noqa: E402

# 'tf32': float32 inputs with torch's TF32 setting on (the kernels' dot products on TF32 tensor cores)
DTYPES = {'fp32': torch.float32, 'tf32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
ARCHS = (80, 86, 89, 90)
GENERATED = os.path.join('docs', 'generated', 'check_kernels.md')  # --write's default, from the repository root
CACHE = os.path.join(os.environ.get('XDG_CACHE_HOME', os.path.expanduser('~/.cache')), 'mmppma',
                     'check_kernels.json')

# Attention stages of the shipped backbones: (name, stage attention per stage, heads, head dims). 'whole' /
# 'cc' are PPMA's polyline whole and criss-cross attention, 'manhattan' / 'rmt_cc' RMT's, 'linear' MLLA's
# polyline-masked linear attention (the decay-scan kernel).
MODELS = {
    'ppma_t': (('cc', 'cc', 'whole', 'whole'), (4, 4, 8, 16), (16, 32, 32, 32)),
    'ppma_s': (('cc', 'cc', 'cc', 'whole'), (4, 4, 8, 16), (16, 32, 32, 32)),
    'ppma_b': (('cc', 'cc', 'cc', 'whole'), (5, 5, 10, 16), (16, 32, 32, 32)),
    'rmt_t': (('rmt_cc', 'rmt_cc', 'manhattan', 'manhattan'), (4, 4, 8, 16), (16, 32, 32, 32)),
    'rmt_s': (('rmt_cc', 'rmt_cc', 'rmt_cc', 'manhattan'), (4, 4, 8, 16), (16, 32, 32, 32)),
    'rmt_b': (('rmt_cc', 'rmt_cc', 'rmt_cc', 'manhattan'), (5, 5, 10, 16), (16, 32, 32, 32)),
    'mlla_t': (('linear', ) * 4, (2, 4, 8, 16), (32, 32, 32, 32)),
    'mlla_b': (('linear', ) * 4, (3, 6, 12, 24), (32, 32, 32, 32)),
}
# Input sizes (H, W) of the shipped configs, padded to a multiple of 32 as their data pipelines do.
IMAGES = {
    'cls_224': ((224, 224), 64),  # (size, images per GPU as the configs batch them)
    'det_800x1344': ((800, 1344), 2),  # Mask R-CNN 1333 x 800, landscape
    'det_1344x800': ((1344, 800), 2),  # portrait
    'upernet_512': ((512, 512), 2),
    'cityscapes_1024x2048': ((1024, 2048), 1),
}
QUICK_IMAGES = ('upernet_512', )
QUICK_MODELS = ('ppma_t', 'mlla_t')
QUICK_DTYPES = ('fp32', 'tf32', 'fp16')  # bf16 compiles like fp16 but for the operand conversions
STRIDES = (4, 8, 16, 32)
# Grid check: every input is also recorded at this batch (the same specializations as at the configs' batch), so
# that every row sees grids as large as the largest batches make them (against lp.GRID_LIMITS)
GRID_BATCH = 1024
# TTGIR ops of asynchronous global -> shared copies, what the software pipeliner makes of the loads of a loop it
# pipelines: cp.async (sm_80 and later) and TMA (sm_90)
ASYNC_COPY = r'\b(?:ttg\.async_copy_global_to_local|ttng\.async_tma_copy_global_to_local)\b'


def model_shapes(images, models, batch=None) -> List[Tuple[str, str, tuple]]:
    """(label, attention, (B, heads, H, W, d)) for every attention stage, duplicates removed; ``batch``: instead
    of the configs' images per GPU."""
    seen, shapes = set(), []
    for image in images:
        (h, w), per_gpu = IMAGES[image]
        batch_ = batch or per_gpu
        for model in models:
            kinds, heads, dims = MODELS[model]
            for stage, (kind, nh, d) in enumerate(zip(kinds, heads, dims)):
                key = (kind, batch_, nh, h // STRIDES[stage], w // STRIDES[stage], d)
                if key not in seen:
                    seen.add(key)
                    shapes.append((f'{image}{f"@{batch}" if batch else ""}/{model}/stage{stage + 1}', kind,
                                   key[1:]))
    return shapes


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, device='meta', dtype=dtype, requires_grad=True)


def grid_problems(grid: Tuple[int, ...]) -> List[str]:
    """The axes of a launch grid over CUDA's limits."""
    return [f'grid axis {axis} = {size} > {limit}' for axis, (size, limit) in enumerate(zip(grid, lp.GRID_LIMITS))
            if size > limit]


def record(kind: str, shape: tuple, dtype: torch.dtype, cap: int) -> List[Tuple[str, lp.Launch]]:
    """Run one op forward and backward on meta tensors; return ('fwd' | 'bwd', launch) for every launch."""
    b, heads, h, w, d = shape
    q, k, v = (_meta(b, heads, h, w, d, dtype=dtype) for _ in range(3))
    la, lb = _meta(b, heads, h, w), _meta(b, heads, h, w)
    log_decay = torch.empty(heads, device='meta')
    call = {
        'whole': lambda: ops.ppma_attention(q, k, v, la, lb, scale=d**-0.5, impl='triton'),
        'cc': lambda: ops.criss_cross_attention(q, k, v, la, lb, impl='triton'),
        'manhattan': lambda: ops.manhattan_attention(q, k, v, log_decay, impl='triton'),
        'rmt_cc': lambda: ops.rmt_criss_cross_attention(q, k, v, log_decay, impl='triton'),
        'linear': lambda: ops.ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True,
                                                    impl='triton'),
    }[kind]
    inputs = [t for t in (q, k, v, la, lb) if t.requires_grad]
    with lp.recording(cap) as forward:
        out = call()
    with lp.recording(cap) as backward:
        torch.autograd.grad(out, inputs, torch.empty_like(out), allow_unused=True)
    return [('fwd', x) for x in forward] + [('bwd', x) for x in backward]


def spec_key(launch: lp.Launch, arch: int) -> Tuple[str, dict]:
    signature, attrs = launch.signature()
    desc = dict(kernel=launch.name, module=launch.kernel.__module__, signature=signature,
                attrs={str(k[0]): v for k, v in attrs.items()}, constexprs=launch.constexprs,
                options=launch.options, arch=arch)
    blob = json.dumps([triton.__version__, launch.kernel.cache_key, desc], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24], desc


def compile_one(desc: dict) -> dict:
    """Compile one specialization for its target; shared bytes, registers, spill bytes and seconds."""
    import importlib

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kernel = getattr(importlib.import_module(desc['module']), desc['kernel'])
    attrs = {(int(k), ): v for k, v in desc['attrs'].items()}
    triton.knobs.compilation.always_compile = True
    triton.knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(ASTSource(kernel, desc['signature'], desc['constexprs'], attrs),
                                      target=GPUTarget('cuda', desc['arch'], 32),
                                      options=desc['options'])
    except Exception as e:  # a compile failure is a result to report
        return dict(error=f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}'[:200],
                    seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    text = log.getvalue()
    regs = re.findall(r'Used (\d+) registers', text)
    spills = re.findall(r'(\d+) bytes spill stores, (\d+) bytes spill loads', text)
    return dict(shared=int(compiled.metadata.shared), registers=max(map(int, regs)) if regs else -1,
                spill=sum(int(a) + int(b) for a, b in spills), seconds=seconds,
                async_copies=len(re.findall(ASYNC_COPY, compiled.asm['ttgir'])))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', type=int, nargs='+', default=list(ARCHS), choices=ARCHS)
    parser.add_argument('--dtype', nargs='+', choices=list(DTYPES), help='default: all; with --quick: fp32 fp16')
    parser.add_argument('--shapes', nargs='+', choices=list(IMAGES), help='input sizes (default: all)')
    parser.add_argument('--models', nargs='+', choices=list(MODELS), help='backbones (default: all)')
    parser.add_argument('--quick', action='store_true',
                        help=f'reduced set: {", ".join(QUICK_IMAGES)} with {", ".join(QUICK_MODELS)}, '
                             f'{" and ".join(QUICK_DTYPES)}')
    parser.add_argument('--kernels', nargs='+', help='only kernels whose name contains one of these')
    parser.add_argument('--jobs', type=int, default=1, help='parallel compiles (default 1)')
    parser.add_argument('--max-seconds', type=float, default=15.0, help='compile time limit per row (0: none)')
    parser.add_argument('--no-cache', action='store_true', help='recompile even what the cache holds')
    parser.add_argument('--write', nargs='?', const=os.path.join(ROOT, GENERATED), metavar='PATH',
                        help=f'also write the table as markdown to PATH (default: {GENERATED})')
    parser.add_argument('--cached-only', action='store_true',
                        help='compile nothing: report the cached specializations and count the others as failed')
    args = parser.parse_args(argv)
    command = ' '.join(['python tools/check_kernels.py'] + list(sys.argv[1:] if argv is None else argv))

    args.dtype = args.dtype or list(QUICK_DTYPES if args.quick else DTYPES)
    images = args.shapes or (QUICK_IMAGES if args.quick else list(IMAGES))
    models = args.models or (QUICK_MODELS if args.quick else list(MODELS))
    shapes = model_shapes(images, models) + model_shapes(images, models, GRID_BATCH)
    dispatch.triton_interpreted = lambda: True  # impl='triton' accepts meta tensors; nothing is launched

    # every distinct specialization, with the shapes that launch it
    specs: Dict[str, dict] = {}
    for arch in args.arch:
        for dtype_name in args.dtype:
            for label, kind, shape in shapes:
                with lp.tf32_matmuls(dtype_name == 'tf32'):
                    launches = record(kind, shape, DTYPES[dtype_name], arch)
                for phase, launch in launches:
                    if args.kernels and not any(part in launch.name for part in args.kernels):
                        continue
                    key, desc = spec_key(launch, arch)
                    row = specs.setdefault(key, dict(desc=desc, dtype=dtype_name, phase=phase, shapes=[],
                                                     grid=(1, 1, 1)))
                    row['shapes'].append(label)
                    row['grid'] = tuple(map(max, zip(launch.grid + (1, ) * (3 - len(launch.grid)), row['grid'])))
    cache = {}
    if not args.no_cache and os.path.exists(CACHE):
        with open(CACHE) as f:
            cache = json.load(f)
    cache = {key: result for key, result in cache.items() if 'async_copies' in result}  # older entries lack it
    todo = [key for key in specs if key not in cache]
    if args.cached_only:
        specs = {key: spec for key, spec in specs.items() if key in cache}
        print(f'--cached-only: {len(todo)} specializations not compiled yet are left out (counted as failed)')
        missing, todo = len(todo), []
    else:
        missing = 0
    print(f'{len(specs)} specializations from {len(shapes)} attention shapes x {len(args.dtype)} dtypes x '
          f'{len(args.arch)} archs; {len(specs) - len(todo)} cached, compiling {len(todo)} with {args.jobs} job(s)',
          flush=True)
    header = (f'{"kernel":<14} {"arch":>4} {"dtype":<5} {"phase":<5} {"tiles":<44} {"warps":>5} {"stages":>6} '
              f'{"shared KB":>9} {"regs":>4} {"spill B":>7} {"async":>5} {"sec":>5}  status')
    print(header, flush=True)
    results = {}

    def report(key, result):
        results[key] = result
        print(format_row(specs[key], result, args.max_seconds), flush=True)

    for key in specs:
        if key in cache:
            report(key, dict(cache[key], cached=True))
    pool = concurrent.futures.ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
    try:
        if pool is None:
            done = ((key, compile_one(specs[key]['desc'])) for key in todo)
        else:
            futures = {pool.submit(compile_one, specs[key]['desc']): key for key in todo}
            done = ((futures[f], f.result()) for f in concurrent.futures.as_completed(futures))
        for count, (key, result) in enumerate(done, 1):
            if 'error' not in result:
                cache[key] = result
            report(key, result)
            if count % 20 == 0 and not args.no_cache:
                save_cache(cache)
    finally:
        if pool is not None:
            pool.shutdown()
        if not args.no_cache:
            save_cache(cache)

    failed = [k for k in specs if status(specs[k], results[k], args.max_seconds) != 'ok']
    summary = [f'{len(specs) - len(failed)} passed, {len(failed) + missing} failed (of {len(specs) + missing} '
               f'specializations{f", {missing} not compiled" if missing else ""})']
    summary += arch_summary(specs, results, args.arch)
    if args.write:
        write_markdown(args.write, specs, results, args.max_seconds, command, summary)
    print('\n' + '\n'.join(summary))
    for key in failed:
        print(f'FAILED {specs[key]["desc"]["kernel"]} sm_{specs[key]["desc"]["arch"]} {specs[key]["dtype"]}: '
              f'{status(specs[key], results[key], args.max_seconds)}; shapes {", ".join(specs[key]["shapes"][:4])}')
    return 1 if failed or missing else 0


def save_cache(cache: dict) -> None:
    os.makedirs(os.path.dirname(CACHE), exist_ok=True)
    with open(CACHE + '.tmp', 'w') as f:
        json.dump(cache, f)
    os.replace(CACHE + '.tmp', CACHE)


def arch_summary(specs: Dict[str, dict], results: Dict[str, dict], archs) -> List[str]:
    """Per target: the largest shared memory and register count, the longest compile."""
    lines = []
    for arch in archs:
        rows = [(specs[k], results[k]) for k in specs if specs[k]['desc']['arch'] == arch and 'error' not in results[k]]
        if rows:
            shared = max(rows, key=lambda r: r[1]['shared'])
            regs = max(rows, key=lambda r: r[1]['registers'])
            secs = max(r[1]['seconds'] for r in rows)
            lines.append(f'sm_{arch}: worst shared memory {shared[1]["shared"] / 1024:.1f} KB of '
                         f'{lp.SHARED_MEMORY_LIMIT[arch] / 1024:.1f} ({shared[0]["desc"]["kernel"]}), most registers '
                         f'{regs[1]["registers"]} ({regs[0]["desc"]["kernel"]}), longest compile {secs:.1f} s')
    return lines


def write_markdown(path: str, specs: Dict[str, dict], results: Dict[str, dict], max_seconds: float, command: str,
                   summary: List[str]) -> None:
    """The table as a markdown page whose header names the command that wrote it."""
    def order(key):
        d = specs[key]['desc']
        return d['arch'], specs[key]['dtype'], d['kernel'], str(sorted(d['constexprs'].items(), key=str))

    lines = ['# Triton kernel specializations compiled for GPU targets', '',
             f'Generated by `{command}` (triton {triton.__version__}, torch {torch.__version__.split("+")[0]}); '
             'do not edit, run the command again. Columns: shared memory per block, registers per thread and '
             'spilled bytes from ptxas, asynchronous copies in the TTGIR (the loads of software-pipelined loops), '
             'compile seconds (of the run that first compiled the row; later runs read it from the cache), the '
             'largest grid of the row\'s launches per axis.', '']
    lines += [f'- {line}' for line in summary] + ['']
    lines += ['| kernel | arch | dtype | tiles and constexprs | warps | stages | shared KB | regs | spill B | '
              'async | compile s | grid | launched by | status |',
              '|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|']
    for key in sorted(specs, key=order):
        spec, result, d = specs[key], results[key], specs[key]['desc']
        shapes = spec['shapes']
        by = shapes[0] + (f' (+{len(shapes) - 1})' if len(shapes) > 1 else '')
        cells = ['-'] * 5 if 'error' in result else [f'{result["shared"] / 1024:.1f}', str(result['registers']),
                                                     str(result['spill']), str(result['async_copies']),
                                                     f'{result["seconds"]:.1f}']
        cells.append(' x '.join(map(str, spec['grid'])))
        lines.append(f'| `{d["kernel"]}` | {d["arch"]} | {spec["dtype"]} | {tile_text(d["constexprs"])} | '
                     f'{d["options"]["num_warps"]} | {d["options"]["num_stages"]} | {" | ".join(cells)} | {by} | '
                     f'{status(spec, result, max_seconds)} |')
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')


def tile_text(c: dict) -> str:
    text = [f'{c.get("BLOCK_M", c.get("BLOCK_OWN"))}x{c.get("BLOCK_N", c.get("BLOCK_OTHER"))}']
    text += [f'{name}={c[name]}' for name in ('COLS', 'ROWS_OWN', 'UNROLLED_ROWS') if name in c]
    text += [f'{name[6:].lower()}{c[name]}' for name in ('BLOCK_D', 'BLOCK_DV', 'BLOCK_X') if name in c]
    # whole attention's backward: the program's own tokens hold the corners of its path ('v2h' for queries, 'h2v'
    # for keys); its forward: 'h2v' named, 'v2h' the default
    corners = 'FORM' in c and 'KEYS' in c and (c['FORM'] == 'h2v') == c['KEYS']
    text += ['keys'] * bool(c.get('KEYS')) + ['corners'] * corners
    text += ['h2v'] * (c.get('FORM') == 'h2v' and 'KEYS' not in c)
    text += [name.lower() for name in ('COLUMNS', 'SIGNED') if c.get(name)]
    if corners:  # what the program computes: token gradients, corner sums or both
        text += ['+'.join(part for part, on in (('grads', c['GRADS']), ('sums', c['CORNER_SUMS'])) if on)]
    text += [f'{c["PRECISION"]}'] if c.get('PRECISION') else []
    return ' '.join(text)


def status(spec: dict, result: dict, max_seconds: float) -> str:
    problems = grid_problems(spec['grid'])  # the largest grid of the row's launches, per axis
    if 'error' in result:
        return '; '.join(problems + ['compile failed: ' + result['error']])
    limit = lp.SHARED_MEMORY_LIMIT[spec['desc']['arch']]
    if result['shared'] > limit:
        problems.append(f'shared memory {result["shared"]} B > {limit} B')
    if result['spill']:
        problems.append(f'{result["spill"]} B spilled')
    if result['registers'] < 0:
        problems.append('no register count in the ptxas log')
    if max_seconds and result['seconds'] > max_seconds:
        problems.append(f'compile {result["seconds"]:.1f} s > {max_seconds:g} s')
    return '; '.join(problems) or 'ok'


def format_row(spec: dict, result: dict, max_seconds: float) -> str:
    desc = spec['desc']
    c = desc['constexprs']
    tiles = tile_text(c)
    if 'error' in result:
        return (f'{desc["kernel"]:<14} {desc["arch"]:>4} {spec["dtype"]:<5} {spec["phase"]:<5} {tiles:<44} '
                f'{desc["options"]["num_warps"]:>5} {desc["options"]["num_stages"]:>6} {"-":>9} {"-":>4} {"-":>7} '
                f'{"-":>5} '
                f'{result["seconds"]:>5.1f}  {status(spec, result, max_seconds)}')
    return (f'{desc["kernel"]:<14} {desc["arch"]:>4} {spec["dtype"]:<5} {spec["phase"]:<5} {tiles:<44} '
            f'{desc["options"]["num_warps"]:>5} {desc["options"]["num_stages"]:>6} {result["shared"] / 1024:>9.1f} '
            f'{result["registers"]:>4} {result["spill"]:>7} {result["async_copies"]:>5} {result["seconds"]:>5.1f}  '
            f'{status(spec, result, max_seconds)}{" (cached)" if result.get("cached") else ""}')


if __name__ == '__main__':
    sys.exit(main())
