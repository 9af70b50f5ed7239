#!/usr/bin/env python
"""Compile every Triton kernel specialization the ops launch for a GPU target, without a GPU, and check it fits.

    python tools/check_kernels.py                          # default shapes, fp32/tf32/fp16/bf16, sm_80/86/89/90
    python tools/check_kernels.py --quick --arch 80 90     # reduced shape set (the CI check)
    python tools/check_kernels.py --arch 86 --dtype fp16 --shapes upernet_512 --jobs 2
    python tools/check_kernels.py --jobs 2 --write         # rewrite docs/generated/check_kernels.md
    python tools/check_kernels.py --sass --dtype bf16 fp16 # with each key loop's SASS cost against plain flash
    python tools/check_kernels.py --model --shapes det_800x1344 --dtype bf16 --arch 90   # predicted op times

The launches are found by running the ops themselves (forward and backward, through ``impl='triton'``) on
``meta`` tensors while :func:`mmppma.ops.triton_support.launch.recording` collects them instead of launching: the same
code that picks tiles, warps and stages at run time, for the capability being checked. Each distinct
specialization is compiled by ``triton.compile`` for that target; ptxas's ``-v`` log gives registers and spill
bytes, the TTGIR the asynchronous copies of software-pipelined loops ('async': their count; 0 where no loop is
pipelined). Every input is also recorded at batch 1024 (the detection input included, without --quick), so that
each row's largest grid is checked against CUDA's limits. A row fails (exit status 1) if compiling fails, the
shared memory exceeds the target's per-block limit, anything spills, compiling takes longer than
``--max-seconds``, a launch's grid passes CUDA's limits, or a half-precision or TF32 row has no tensor-core
instruction in its SASS. ``--arch`` also takes GPUs outside the launch tables (75, 100, 120): they get the default
rows of the tables, and ``impl='auto'`` runs the kernels there only once their rows pass. Results are cached per
specialization (kernel source, arguments, target, triton version) in ``~/.cache/mmppma/check_kernels.json``.

``--sass``: each row also gets the cost of one iteration of its key loop (the innermost loop holding the matrix
products, :mod:`sass_cost`): SASS instructions per score by class, and the ratio to a plain flash-attention kernel
(:mod:`flash_reference`: the forward for forward kernels and the scan, the backward in the same role for backward
kernels) compiled in the same run with the same tiles, warps, stages, dtype and target. ``--sass-limit``: the half
precision rows of the attention kernels also fail above :data:`SASS_LIMITS` (the scan, PPMLA's fused kernels,
which have no flash analogue, and float32 rows are reported without a limit).

``--model``: each op call's predicted kernel time (:mod:`kernel_model`: key-loop SASS by pipe x computed scores,
occupancy, waves) against flash attention with FlashAttention-2's tiles over the same real scores;
``--model-limit`` fails the calls outside :data:`MODEL_LIMITS`, :data:`REAL_SHARE` and :data:`FORWARD_WARPS`;
``--validate`` sets the model against the H200 run (``docs/kernel_model.md``); ``--kernels-at REV`` compiles the
kernels and launch tables of ``mmppma/`` at a git revision.
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
from typing import Dict, List, Optional, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if '--kernels-at' in sys.argv[:-1]:  # the ops (and the model tables) of another commit, this tool's pricing
    import atexit
    import shutil
    import subprocess
    import tempfile
    _REVISION = sys.argv[sys.argv.index('--kernels-at') + 1]
    _TREE = tempfile.mkdtemp(prefix='mmppma-kernels-')
    atexit.register(shutil.rmtree, _TREE, True)
    archive = subprocess.run(['git', '-C', ROOT, 'archive', _REVISION, 'mmppma'], capture_output=True, check=True)
    subprocess.run(['tar', '-x', '-C', _TREE], input=archive.stdout, check=True)
    sys.path.insert(0, _TREE)
sys.path.insert(0, os.path.join(ROOT, 'tools'))  # flash_reference, sass_cost (the workers import them by name)

import flash_reference  # noqa: E402
import kernel_model  # noqa: E402
import sass_cost  # noqa: E402
import triton  # noqa: E402

import mmppma.ops as ops  # noqa: E402
from mmppma.models.backbones.stages import IMAGES, SHIPPED, STRIDES, attention_stages, model_shapes  # noqa: E402,F401

try:
    from mmppma.ops import devices, plan  # noqa: E402
except ImportError:  # --kernels-at a revision whose mmppma.ops.dispatch held both
    from mmppma.ops import dispatch as devices  # noqa: E402
    plan = devices
from mmppma.ops.triton_support import launch as lp  # noqa: E402

# 'tf32': float32 inputs with torch's TF32 setting on (the kernels' dot products on TF32 tensor cores)
DTYPES = {'fp32': torch.float32, 'tf32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
# the capabilities with launch tables (the default), and every one the tool compiles for: a GPU outside the tables
# (sm_75, sm_100, sm_120) gets its rows checked here before it can join them (mmppma.ops.devices.CAPABILITIES)
ARCHS = devices.CAPABILITIES
TARGETS = devices.TARGET_CAPABILITIES
# rows whose products must run on tensor cores (unless a launch asks for exact float32 products, as the scan does
# on its float32 state): Triton gives sm_75 none, and then the kernels are no faster than the torch path
TENSOR_CORE_DTYPES = ('fp16', 'bf16', 'tf32')
GENERATED = os.path.join('docs', 'generated', 'check_kernels.md')  # --write's default, from the repository root
CACHE = os.path.join(os.environ.get('XDG_CACHE_HOME', os.path.expanduser('~/.cache')), 'mmppma',
                     'check_kernels.json')

# The attention stages of the shipped backbones (from their arch tables) at the shipped configs' input sizes
MODELS = {label: attention_stages(label) for label in SHIPPED}
QUICK_IMAGES = ('upernet_512', )
QUICK_MODELS = ('ppma_t', 'mlla_t')
QUICK_DTYPES = ('fp32', 'tf32', 'fp16')  # bf16 compiles like fp16 but for the operand conversions
# Grid check: every input is also recorded at this batch (the same specializations as at the configs' batch), so
# that every row sees grids as large as the largest batches make them (against lp.GRID_LIMITS)
GRID_BATCH = 1024
# TTGIR ops of asynchronous global -> shared copies, what the software pipeliner makes of the loads of a loop it
# pipelines: cp.async (sm_80 and later) and TMA (sm_90)
ASYNC_COPY = r'\b(?:ttg\.async_copy_global_to_local|ttng\.async_tma_copy_global_to_local)\b'
# --sass-limit: the most SASS per score a half-precision attention kernel's key loop may issue, relative to the
# plain flash kernel's at the same tiles, warps and stages
SASS_LIMITS = {'_whole_fwd': 1.6, '_line_fwd': 1.5, '_whole_bwd': 2.0, '_line_bwd': 2.5}
SASS_LIMITED_DTYPES = ('fp16', 'bf16')


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
    if kind in ('whole', 'cc'):  # PPMA's learned decays: their tables from the layer's tokens
        x, params = _meta(b, h, w, heads * d, dtype=dtype), [_meta(2, d), _meta(heads), _meta(heads)]
        with lp.recording(cap) as tables_forward:
            tables = ops.path_decay_tables(x, *params, impl='triton')
        with lp.recording(cap) as tables_backward:
            torch.autograd.grad(tables, [x, *params], [torch.empty_like(t) for t in tables])
        forward, backward = forward + tables_forward, backward + tables_backward
    return [('fwd', x) for x in forward] + [('bwd', x) for x in backward]


def priced(desc: dict) -> bool:
    """Whether a kernel's key loop is priced against a plain flash kernel: those with matrix products (a PRECISION
    constexpr; they run on tensor cores in half precision), except whole attention's launches of two paths or (the
    backward) of both roles and the line backward's of both roles, which are priced part by part
    (:func:`paths_apart`). The others (the decay tables')
    are compiled and checked only."""
    c = desc['constexprs']
    return 'PRECISION' in c and not (c.get('V2H') and c.get('H2V')) and not c.get('BOTH')


def parts_apart(c: dict) -> List[dict]:
    """The constexprs of each part of a launch that :func:`priced` leaves out - one path of whole attention, one role
    of a backward (:func:`kernel_model.tiles`' order) - launched as they are by the forms of one path and by roles
    apart."""
    roles = ([dict(KEYS=keys, **({'BOTH': False} if 'BOTH' in c else {})) for keys in kernel_model.bwd_roles(c)]
             if 'KEYS' in c else [{}])  # (kernels before BOTH: --kernels-at)
    paths = [{'H2V': False} if path == 'v2h' else {'V2H': False} if c['V2H'] else {}
             for path in ('v2h', 'h2v') if c[path.upper()]] if 'V2H' in c else [{}]
    return [dict(c, **role, **path) for role in roles for path in paths]


def paths_apart(specs: Dict[str, dict]) -> Dict[str, dict]:
    """For every launch of whole attention's two paths or both roles, the same kernel with one path and role each
    (:func:`parts_apart`): the rows its pricing takes (each part's key loop against a flash kernel with that part's
    tiles)."""
    import importlib
    parts = {}
    for spec in specs.values():
        desc = spec['desc']
        c = desc['constexprs']
        if 'PRECISION' in c and not priced(desc):
            kernel = getattr(importlib.import_module(desc['module']), desc['kernel'])
            for constexprs in parts_apart(c):
                part = dict(desc, constexprs=constexprs)
                parts.setdefault(desc_key(kernel, part), dict(spec, desc=part, shapes=list(spec['shapes']),
                                                              maps=list(spec['maps'])))
    return {key: part for key, part in parts.items() if key not in specs}


def spec_key(launch: lp.Launch, arch: int) -> Tuple[str, dict]:
    signature, attrs = launch.signature()
    desc = dict(kernel=launch.name, module=launch.kernel.__module__, signature=signature,
                attrs={str(k[0]): v for k, v in attrs.items()}, constexprs=launch.constexprs,
                options=launch.options, arch=arch)
    return desc_key(launch.kernel, desc), desc


def desc_key(kernel, desc: dict) -> str:
    """The cache key of a specialization: kernel source, description, triton version."""
    blob = json.dumps([triton.__version__, kernel.cache_key, desc], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def reference(spec: dict) -> Tuple[str, dict]:
    """(cache key, description) of the plain flash kernel that ``spec``'s SASS cost is compared with: the masked
    variant where a shape that launches it has a sequence that is not a multiple of the other block."""
    ref = flash_reference.reference_desc(spec['desc'], ragged(spec))
    return desc_key(getattr(flash_reference, ref['kernel']), ref), ref


def sequence(desc: dict, h: int, w: int) -> int:
    """The length of the sequence a kernel's programs attend over on an h x w map, as flash attention would see
    it: a line's length for the line kernels (columns: h), the whole map's tokens for the others."""
    if desc['kernel'].startswith('_line'):
        return h if desc['constexprs'].get('COLUMNS') else w
    return h * w


def ragged(spec: dict) -> bool:
    """Whether flash attention with the row's other block would need masks on a shape that launches it."""
    other = flash_reference.tiles(spec['desc']['constexprs'])[1]
    return any(sequence(spec['desc'], h, w) % other for h, w in spec['maps'])


def _filled(extent: int, block: int) -> float:
    """The share of ``block``-sized tiles over ``extent`` tokens that holds real tokens."""
    return extent / (-(-extent // block) * block)


def real_shares(spec: dict) -> Tuple[float, float]:
    """(ours, flash's): the share of the scores the tiles compute that are real, on the first shape that launches
    the row (:func:`kernel_model.tiles`: whole attention's tiles hold one map row of own tokens, its width padded
    to the own block, and (rows x columns) blocks of the map's other tokens; the line kernels' tiles pad each
    line); flash pads the sequence of :func:`sequence` to its two blocks. NaN for kernels without such a layout."""
    desc = spec['desc']
    h, w = spec['maps'][0]
    own, other = flash_reference.tiles(desc['constexprs'])
    n = sequence(desc, h, w)
    flash = _filled(n, own) * _filled(n, other)
    try:
        _, (programs, iterations, own, other) = kernel_model.tiles(desc, h, w, 1)[0]  # a priced row has one part
    except KeyError:
        return float('nan'), flash
    return kernel_model.real_scores(desc, h, w, 1) / (programs * iterations * own * other), flash


def kv_bytes(spec: dict) -> float:
    """Bytes of the other tokens' two operands (K and V, or Q and dO) read per score: one block of each per
    key-loop iteration, shared by the own block's rows."""
    c = spec['desc']['constexprs']
    size = 4 if spec['dtype'] in ('fp32', 'tf32') else 2
    # the table's parts per key where the products add them: a line's, or whole attention's on a path the launch
    # runs and folds
    parts = 32 if c.get('FOLD') or (c.get('V2H') and c.get('FOLD_V')) or (c.get('H2V') and c.get('FOLD_H')) else 0
    return ((c['BLOCK_D'] + c.get('BLOCK_DV', c.get('BLOCK_X', c['BLOCK_D']))) * size + parts) / \
        flash_reference.tiles(c)[0]


def key_loop(spec: dict, result: dict) -> dict:
    """The row's key-loop counts per iteration: where some key rows run in a loop of their own, priced by their
    share on the row's first map (:func:`_by_key_rows`)."""
    loop = result.get('sass', {})
    if not loop.get('all') or not spec.get('maps'):
        return loop
    h, w = spec['maps'][0]
    try:
        parts = kernel_model.tiles(spec['desc'], h, w, 1)
    except KeyError:
        return loop
    return _by_key_rows(spec['desc'], parts[0][0], loop, h, w) if len(parts) == 1 else loop


def sass_ratio(spec: dict, result: dict) -> float:
    """The row's key-loop instructions (:func:`key_loop`) relative to its plain flash kernel's (same tiles: the
    same scores per iteration); NaN where either has no key loop. A line backward's loop of both roles (ONE_BLOCK)
    against two of the plain kernel's (its reference is the queries' loop, the shorter role's: the keys' adds the
    dV product)."""
    ours, flash = key_loop(spec, result).get('all', 0), result.get('flash', {}).get('all', 0)
    if not (ours and flash):
        return float('nan')
    return ours / (flash * (2 if spec['desc']['constexprs'].get('ONE_BLOCK') else 1))


def per_score(spec: dict, count: int) -> float:
    """Warp instructions per score of ``count`` instructions per warp per key-loop iteration."""
    c, options = spec['desc']['constexprs'], spec['desc']['options']
    own, other = flash_reference.tiles(c)
    scores = own * other
    return count * options['num_warps'] / scores


def sass_limit(spec: dict) -> float:
    """The row's limit on :func:`sass_ratio` (inf: reported without one)."""
    if spec['dtype'] not in SASS_LIMITED_DTYPES:
        return float('inf')
    return SASS_LIMITS.get(spec['desc']['kernel'], float('inf'))


# ---- --model: each op call's predicted time (tools/kernel_model.py) ------------------------------------------------

#: the op kinds priced against flash attention, and their limits on the predicted kernel time over flash's for the
#: same real scores, half precision (whole attention: both paths of form 'release', two softmaxes)
MODEL_LIMITS = {('whole', 'fwd'): 2.4, ('whole', 'bwd'): 2.8, ('manhattan', 'fwd'): 1.3, ('manhattan', 'bwd'): 1.5,
                ('cc', 'fwd'): 1.5, ('cc', 'bwd'): 1.5, ('rmt_cc', 'fwd'): 1.5, ('rmt_cc', 'bwd'): 1.5}
MODEL_KINDS = {kind for kind, _ in MODEL_LIMITS}
#: the least share of real scores among those computed (or flash's own share for the sequence, where lower)
REAL_SHARE = 0.85
#: the least warps per SM of a forward launch on sm_90
FORWARD_WARPS = 12


def flash_sequences(kind: str, shape: tuple) -> List[Tuple[int, int, int]]:
    """(1, length, slices) of the sequences flash attention runs over for the same real scores as an op call: the
    whole map for whole and Manhattan attention, each row and each column for the criss-cross ones."""
    b, heads, h, w, _ = shape
    if kind in ('cc', 'rmt_cc'):
        return [(1, w, b * heads * h), (1, h, b * heads * w)]
    return [(1, h * w, b * heads)]


def flash_desc(template: dict, n: int, keys: Optional[bool]) -> Tuple[str, dict]:
    """(cache key, description) of the plain flash kernel (forward, or the backward's keys or queries programs)
    with FlashAttention-2's tiles for ``n`` tokens, in the dtype, head dims and target of ``template``'s kernel."""
    c = template['constexprs']
    own, other, warps, stages = kernel_model.flash_tiles(n)
    tiles = dict(BLOCK_M=own, BLOCK_N=other) if keys is None else dict(KEYS=keys, BLOCK_OWN=own, BLOCK_OTHER=other)
    source = dict(signature={'q_ptr': template['signature']['q_ptr'], 'N': 'i32'},
                  attrs={'1': [['tt.divisibility', 16]]} if n % 16 == 0 else {},
                  constexprs=dict(tiles, BLOCK_D=c['BLOCK_D'], PRECISION=c['PRECISION'],
                                  BLOCK_DV=c.get('BLOCK_DV', c.get('BLOCK_X', c['BLOCK_D']))),
                  options=dict(num_warps=warps, num_stages=stages), arch=template['arch'])
    desc = flash_reference.reference_desc(source, ragged=n % other != 0)
    return desc_key(getattr(flash_reference, desc['kernel']), desc), desc


def _template(specs: Dict[str, dict], launches) -> Optional[dict]:
    """The description of a call's first launch with a key loop."""
    return next((specs[key]['desc'] for _, key, _ in launches if specs[key]['desc']['kernel'] in PRICED_LOOPS), None)


def _parts_bytes(launch: lp.Launch) -> float:
    """Bytes whole attention's column-table parts' launch moves: per path, slice and token, the table's float32
    entry read and 16 bfloat16 written."""
    return launch.grid[1] * launch.grid[2] * launch.constexprs['HH'] * launch.constexprs['WW'] * (4 + 32)


#: an op call's elementwise launches beside its key loops: kernel -> the bytes a launch moves (priced as device
#: memory traffic and a launch)
MEMORY_PASSES = {'_whole_fwd_parts': _parts_bytes}
#: the kernels whose launches the model prices (kernel_model.tiles knows their tiles)
PRICED_LOOPS = ('_whole_fwd', '_whole_bwd', '_line_fwd', '_line_bwd')


def model_flash(specs: Dict[str, dict], calls: Dict[tuple, list]) -> Dict[str, dict]:
    """The plain flash kernels (FlashAttention-2's tiles) of every priced call's sequences, by cache key."""
    descs = {}
    for (arch, dtype, label, kind, shape), launches in calls.items():
        template = _template(specs, launches)
        if kind not in MODEL_KINDS or template is None:
            continue
        for _, n, _ in flash_sequences(kind, shape):
            for keys in (None, True, False):
                key, desc = flash_desc(template, n, keys)
                descs[key] = desc
    return descs


def _launch_cost(gpu, desc: dict, dtype: str, result: dict, loops: List[dict], h: int, w: int, bh: int) -> dict:
    """Cycles, computed and real scores, resident warps and bound of one launch: each part (a path of whole
    attention, a role of its backward) priced with its own key loop (``loops``), their programs in one grid
    (:func:`kernel_model.parts_cost`), under the launch's registers and shared memory."""
    spec = dict(desc=desc, dtype=dtype)
    parts = [(_by_key_rows(desc, name, loop, h, w), tile, kv_bytes(spec), kernel_model.real_scores(desc, h, w, bh))
             for (name, tile), loop in zip(kernel_model.tiles(desc, h, w, bh), loops)]
    cost = kernel_model.parts_cost(gpu, parts, dtype, desc['options']['num_warps'], result['registers'],
                                   result['shared'])
    return dict(cycles=cost.cycles, computed=cost.computed, real=cost.real,
                warps=cost.resident * desc['options']['num_warps'], bound=cost.bound, us=cost.us)


def _by_key_rows(desc: dict, part: str, loop: dict, h: int, w: int) -> dict:
    """A whole-attention part's key loop per iteration where it runs some key rows in a loop of their own, the
    longest: that loop's counts for its share of the iterations and the next longest loop's for the rest - the
    forward's full key tiles between the query tile's rows (they keep the absolute value per score;
    :func:`kernel_model.between_share`), the backward queries' other tiles that hold an own row (the corners' sums;
    :func:`kernel_model.own_rows_share`); the loop as it is otherwise."""
    c = desc['constexprs']
    if 'side' not in loop:
        return loop
    path = part.split()[0]
    # the path's forward map: the forward's and the backward queries' (the keys' run on its transpose)
    rows, cols = (h, w) if path == 'v2h' else (w, h)
    chunk = c.get('COLS_V' if path == 'v2h' else 'COLS_H')
    if desc['kernel'] == '_whole_fwd' and 'BLOCK_M' in c:
        from mmppma.ops.whole.triton_impl import between_loop, full_key_tiles
        key_rows = c['BLOCK_N'] // chunk
        # (as _fwd_map decides its FULL and MEET)
        if not (c.get('SCORES_LAYOUT') and full_key_tiles(rows, chunk, c['BLOCK_N'])
                and between_loop(cols, key_rows, c['BLOCK_M'])):
            return loop
        share = kernel_model.between_share(rows, cols, c['BLOCK_M'], key_rows)
    elif desc['kernel'] == '_whole_bwd' and 'BLOCK_OWN' in c and not (part.endswith(' keys') or c['KEYS']):
        share = kernel_model.own_rows_share(rows, cols, c['BLOCK_OWN'], c['BLOCK_OTHER'] // chunk)
    else:
        return loop
    side = loop['side']
    return dict(loop, **{cls: share * loop[cls] + (1 - share) * side[cls] for cls in side})


def _loops(specs: Dict[str, dict], results: Dict[str, dict], key: str) -> Optional[List[dict]]:
    """The key-loop counts of each part of a launch: whole attention's launches of two paths or both roles take
    each part's (:func:`paths_apart`), the others their own; None where one is missing (not compiled, or no key
    loop)."""
    import importlib
    desc = specs[key]['desc']
    c = desc['constexprs']
    keys = [key]
    if not priced(desc):
        kernel = getattr(importlib.import_module(desc['module']), desc['kernel'])
        keys = [desc_key(kernel, dict(desc, constexprs=part)) for part in parts_apart(c)]
    loops = [results.get(k, {}).get('sass') for k in keys]
    return None if any(not loop or not loop.get('all') for loop in loops) else loops


def model_table(specs: Dict[str, dict], results: Dict[str, dict], calls: Dict[tuple, list]) -> List[dict]:
    """Per priced op call and phase: the predicted time of its key-loop launches and of flash attention's over the
    same real scores, their ratio, the share of real scores, the least resident warps per SM and the problems
    against :data:`MODEL_LIMITS`, :data:`REAL_SHARE` and :data:`FORWARD_WARPS` (half precision)."""
    rows = []
    for (arch, dtype, label, kind, shape), launches in calls.items():
        template = _template(specs, launches)
        if kind not in MODEL_KINDS or template is None:
            continue
        gpu = kernel_model.GPUS[arch]
        b, heads, h, w, _ = shape
        for phase in ('fwd', 'bwd'):
            row = dict(arch=arch, dtype=dtype, label=label, kind=kind, phase=phase, ours=0.0, flash=0.0,
                       computed=0.0, real=0.0, flash_computed=0.0, flash_real=0.0, warps=None, bound='', launches=0,
                       problems=[])
            largest = 0.0
            for launch_phase, key, launch in launches:
                desc = specs[key]['desc']
                if launch_phase == phase and desc['kernel'] in MEMORY_PASSES:
                    row['ours'] += gpu.launch_us + kernel_model.memory_us(gpu, MEMORY_PASSES[desc['kernel']](launch))
                    continue
                if launch_phase != phase or desc['kernel'] not in PRICED_LOOPS:
                    continue
                loops = _loops(specs, results, key)
                if loops is None or 'error' in results[key]:
                    row['problems'].append(f'{desc["kernel"]}: not priced (not compiled or no key loop)')
                    continue
                cost = _launch_cost(gpu, desc, dtype, results[key], loops, h, w, b * heads)
                row['ours'] += cost['us'] + gpu.launch_us
                row['launches'] += 1
                row['computed'] += cost['computed']
                row['real'] += cost['real']
                row['warps'] = cost['warps'] if row['warps'] is None else min(row['warps'], cost['warps'])
                if cost['us'] > largest:
                    largest, row['bound'] = cost['us'], f'{desc["kernel"]}: {cost["bound"]}'
            for one, n, slices in flash_sequences(kind, shape):
                for keys in ((None, ) if phase == 'fwd' else (True, False)):
                    key, desc = flash_desc(template, n, keys)
                    loop = results.get(key, {}).get('sass')
                    if not loop:
                        row['problems'].append(f'flash over {n} tokens: not compiled')
                        continue
                    cost = _launch_cost(gpu, desc, dtype, results[key], [loop], one, n, slices)
                    row['flash'] += cost['us'] + gpu.launch_us
                    row['flash_computed'] += cost['computed']
                    row['flash_real'] += cost['real']
            if not row['launches']:
                continue
            row['ratio'] = row['ours'] / row['flash'] if row['flash'] else float('nan')
            row['share'] = row['real'] / row['computed']
            row['flash_share'] = row['flash_real'] / row['flash_computed'] if row['flash_computed'] else float('nan')
            if dtype in SASS_LIMITED_DTYPES:
                limit = MODEL_LIMITS[kind, phase]
                if not row['ratio'] <= limit:
                    row['problems'].append(f'{row["ratio"]:.2f}x flash > {limit:g}x')
                least = min(REAL_SHARE, row['flash_share'])
                if not row['share'] >= least - 1e-9:
                    row['problems'].append(f'real scores {row["share"]:.0%} < {least:.0%}')
                if phase == 'fwd' and arch == 90 and (row['warps'] or 0) < FORWARD_WARPS:
                    row['problems'].append(f'{row["warps"]} warps per SM < {FORWARD_WARPS}')
            rows.append(row)
    return rows


def model_markdown(rows: List[dict]) -> List[str]:
    """The --model section of the page."""
    lines = ['## Predicted time per op call (tools/kernel_model.py)', '',
             'Predicted, not measured: each op call\'s key-loop launches (their launch cost included, no host time) '
             'against flash attention with FlashAttention-2\'s tiles over the same real scores, `x flash` their '
             'ratio; `real`: the share of real scores among those the launches compute (ours, flash\'s); `warps`: '
             'the fewest resident warps per SM of the call\'s launches; `bound`: what bounds the longest launch. '
             'Method and rates: [docs/kernel_model.md](../kernel_model.md).', '',
             '| op call | arch | dtype | phase | ours us | flash us | x flash | real | flash real | warps | bound | '
             'problems |', '|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|']
    for row in rows:
        lines.append(f'| {row["label"]} {row["kind"]} | {row["arch"]} | {row["dtype"]} | {row["phase"]} | '
                     f'{row["ours"]:.1f} | {row["flash"]:.1f} | {row["ratio"]:.2f} | {row["share"]:.0%} | '
                     f'{row["flash_share"]:.0%} | {row["warps"]} | {row["bound"]} | {"; ".join(row["problems"])} |')
    return lines + ['']


def validation_text(fit: dict, rows: List[dict]) -> List[str]:
    """The --validate table (markdown): predicted against measured, per op call and phase."""
    overhead = {phase: fit[phase]['overhead_ms'] * 1e3 for phase in fit}
    lines = [f'Fitted on the SDPA rows: issue share {fit["fwd"]["issue_share"]:.3f}, SDPA call overhead '
             f'{overhead["fwd"]:.0f} us (fwd), {overhead["fwd+bwd"]:.0f} us (fwd+bwd)', '',
             '| op call | phase | predicted ms (kernels) | measured ms | error | predicted x SDPA | measured x SDPA '
             '| error |', '|---|---|---:|---:|---:|---:|---:|---:|']
    for row in rows:
        ratio = (f'{row["ratio"]:.2f} | {row["ratio_measured"]:.2f} | {row["ratio_error"]:+.0%}' if 'ratio' in row
                 else '- | - | -')
        lines.append(f'| {row["label"]} {row["kind"]} | {row["phase"]} | {row["ours"]:.3f} ({row["kernels"]:.3f}) | '
                     f'{row["measured"]:.3f} | {row["error"]:+.0%} | {ratio} |')
    return lines


def model_text(rows: List[dict]) -> List[str]:
    """The --model table: per op call and phase, predicted microseconds (kernels and launches, no host time)."""
    lines = [f'{"op call (predicted)":<40} {"arch":>4} {"dtype":<5} {"phase":<5} {"ours us":>9} {"flash us":>9} '
             f'{"x flash":>7} {"real":>5} {"flash":>5} {"warps":>5}  bound; problems']
    for row in rows:
        lines.append(f'{row["label"] + " " + row["kind"]:<40} {row["arch"]:>4} {row["dtype"]:<5} {row["phase"]:<5} '
                     f'{row["ours"]:>9.1f} {row["flash"]:>9.1f} {row["ratio"]:>7.2f} {row["share"]:>5.0%} '
                     f'{row["flash_share"]:>5.0%} {row["warps"]:>5}  {row["bound"]}'
                     + (f'; {"; ".join(row["problems"])}' if row['problems'] else ''))
    return lines


def compile_one(desc: dict, sass: bool = False) -> dict:
    """Compile one specialization for its target; shared bytes, registers, spill bytes and seconds; with
    ``sass``, its key loop's instructions by class (:func:`sass_cost.loop_cost`)."""
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
    result = dict(shared=int(compiled.metadata.shared), registers=max(map(int, regs)) if regs else -1,
                  spill=sum(int(a) + int(b) for a, b in spills), seconds=seconds,
                  async_copies=len(re.findall(ASYNC_COPY, compiled.asm['ttgir'])))
    result['mma'] = sass_cost.mma_count(compiled.asm['cubin'])
    if sass:
        result['sass'] = sass_cost.loop_cost(compiled.asm['cubin'])
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', type=int, nargs='+', default=list(ARCHS), choices=TARGETS)
    parser.add_argument('--dtype', nargs='+', choices=list(DTYPES),
                        help=f'default: all; with --quick: {" ".join(QUICK_DTYPES)}')
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
    parser.add_argument('--sass', action='store_true',
                        help='also price each key loop in SASS against a plain flash kernel (see the docstring)')
    parser.add_argument('--sass-limit', nargs='*', metavar='KERNEL',
                        help='with --sass: fail half-precision rows above SASS_LIMITS (of these kernels; '
                             'default: every limited kernel)')
    parser.add_argument('--model', action='store_true',
                        help='with --sass: each op call\'s predicted kernel time against flash attention\'s '
                             '(tools/kernel_model.py, docs/kernel_model.md)')
    parser.add_argument('--model-limit', action='store_true',
                        help='with --model: fail the op rows above MODEL_LIMITS, under REAL_SHARE or FORWARD_WARPS')
    parser.add_argument('--validate', action='store_true',
                        help='with --model: the model against the H200 run of docs/gpu_runs.md (its kernels: '
                             '--kernels-at 2e28041 under triton 3.6.0; docs/kernel_model.md)')
    parser.add_argument('--kernels-at', metavar='REVISION',
                        help='compile the kernels and launch tables of mmppma/ at this git revision (the cache keeps '
                             'them apart by source)')
    parser.add_argument('--one-shape', action='store_true',
                        help='per kernel, arch and dtype only the specializations of the first shape that '
                             'launches it (of a kernel without products of its inputs, PRECISION: its first '
                             'specialization)')
    args = parser.parse_args(argv)
    args.model = args.model or args.model_limit or args.validate
    args.sass = args.sass or args.model
    if args.sass_limit is not None:
        args.sass = True
        limited = set(args.sass_limit or SASS_LIMITS)
    command = ' '.join(['python tools/check_kernels.py'] + list(sys.argv[1:] if argv is None else argv))

    args.dtype = args.dtype or list(QUICK_DTYPES if args.quick else DTYPES)
    images = args.shapes or (QUICK_IMAGES if args.quick else list(IMAGES))
    models = args.models or (QUICK_MODELS if args.quick else list(MODELS))
    modelled = model_shapes(images, models)  # at the configs' batches: the shapes --model prices
    shapes = modelled + model_shapes(images, models, GRID_BATCH)
    calls: Dict[tuple, List[Tuple[str, str, lp.Launch]]] = {}  # (arch, dtype, label, kind, shape) -> launches
    plan.triton_interpreted = lambda: True  # impl='triton' accepts meta tensors; nothing is launched

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
                    if (label, kind, shape) in modelled:
                        calls.setdefault((arch, dtype_name, label, kind, shape), []).append((phase, key, launch))
                    row = specs.setdefault(key, dict(desc=desc, dtype=dtype_name, phase=phase, shapes=[], maps=[],
                                                     grid=(1, 1, 1)))
                    row['shapes'].append(label)
                    row['maps'].append(shape[2:4])
                    row['grid'] = tuple(map(max, zip(launch.grid + (1, ) * (3 - len(launch.grid)), row['grid'])))
    if args.one_shape:
        def kernel_of(spec):
            return spec['desc']['kernel'], spec['desc']['arch'], spec['dtype']

        def products(spec):  # kernels with matrix products of inputs: the first shape's specializations (the others,
            return 'PRECISION' in spec['desc']['constexprs']  # compiled and checked only: the first specialization)
        first = {}
        for key, spec in specs.items():
            first.setdefault(kernel_of(spec), spec['shapes'][0] if products(spec) else key)
        specs = {key: spec for key, spec in specs.items()
                 if (first[kernel_of(spec)] in spec['shapes'] if products(spec) else first[kernel_of(spec)] == key)}
    if args.sass:
        specs.update(paths_apart(specs))
    for spec in specs.values():
        spec['sass_limit'] = (sass_limit(spec) if args.sass_limit is not None and priced(spec['desc'])
                              and spec['desc']['kernel'] in limited else float('inf'))
    # --sass: the plain flash kernels to compare with, compiled (and cached) as specializations of their own
    references = {}
    if args.sass:
        for spec in specs.values():
            if priced(spec['desc']):
                spec['reference'], desc = reference(spec)
                references[spec['reference']] = desc
    # the plain kernels first: each row prints once its own is compiled
    if args.model:  # flash attention with FlashAttention-2's tiles over each priced call's sequences
        references.update(model_flash(specs, calls))
    descs = dict(references, **{key: spec['desc'] for key, spec in specs.items()})
    cache = {}
    if not args.no_cache and os.path.exists(CACHE):
        with open(CACHE) as f:
            cache = json.load(f)
    cache = {key: result for key, result in cache.items() if 'mma' in result}  # older entries lack it
    todo = [key for key in descs if key not in cache or args.sass and priced(descs[key])
            and cache[key].get('sass', {}).get('pricing') != sass_cost.PRICING]
    if args.cached_only:
        specs = {key: spec for key, spec in specs.items() if key not in todo and spec.get('reference') not in todo}
        print(f'--cached-only: {len(todo)} specializations not compiled yet are left out (counted as failed)')
        missing, todo = len(todo), []
    else:
        missing = 0
    print(f'{len(specs)} specializations from {len(shapes)} attention shapes x {len(args.dtype)} dtypes x '
          f'{len(args.arch)} archs{f" and {len(references)} plain flash kernels" if args.sass else ""}; '
          f'{len(descs) - len(todo)} cached, compiling {len(todo)} with {args.jobs} job(s)', flush=True)
    header = (f'{"kernel":<14} {"arch":>4} {"dtype":<5} {"phase":<5} {"tiles":<44} {"warps":>5} {"stages":>6} '
              f'{"shared KB":>9} {"regs":>4} {"spill B":>7} {"async":>5} {"sec":>5} '
              f'{" sass/score  x flash " if args.sass else ""} status')
    print(header, flush=True)
    results, waiting = {}, {}  # waiting: rows whose plain flash kernel is not compiled yet

    def report(key, result):
        results[key] = result
        if key in references:  # a plain flash kernel: its rows can print now
            for row in [row for row, ref in waiting.items() if ref == key]:
                del waiting[row]
                report(row, results[row])
            return
        reference_key = specs[key].get('reference')
        if reference_key is not None and reference_key not in results:
            waiting[key] = reference_key
            return
        if reference_key is not None:
            result['flash'] = results[reference_key].get('sass', {})
        print(format_row(specs[key], result, args.max_seconds, args.sass), flush=True)

    for key in descs:
        if key in cache and key not in todo and (key in specs or key in references):
            report(key, dict(cache[key], cached=True))
    pool = concurrent.futures.ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
    try:
        if pool is None:
            done = ((key, compile_one(descs[key], args.sass and priced(descs[key]))) for key in todo)
        else:
            futures = {pool.submit(compile_one, descs[key], args.sass and priced(descs[key])): key for key in todo}
            done = ((futures[f], f.result()) for f in concurrent.futures.as_completed(futures))
        for count, (key, result) in enumerate(done, 1):
            if 'error' not in result:
                cache[key] = result
            report(key, dict(result))
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
    if args.sass:
        summary += sass_summary(specs, results)
    model_rows, over = [], []
    if args.model:
        model_rows = model_table(specs, results, calls)
        print('\n' + '\n'.join(model_text(model_rows)))
        over = [row for row in model_rows if row['problems']] if args.model_limit else []
        if args.validate:
            print('\n' + '\n'.join(validation_text(*kernel_model.validate(model_rows,
                                                                             kernel_model.GPUS[90].issue_share))))
        summary.append(f'time model: {len(model_rows)} op rows, {len([r for r in model_rows if r["problems"]])} '
                       f'outside the limits{" (enforced)" if args.model_limit else " (--model-limit enforces them)"}')
    if args.write:
        write_markdown(args.write, specs, results, args.max_seconds, command, summary, args.sass, model_rows)
    print('\n' + '\n'.join(summary))
    for key in failed:
        print(f'FAILED {specs[key]["desc"]["kernel"]} sm_{specs[key]["desc"]["arch"]} {specs[key]["dtype"]}: '
              f'{status(specs[key], results[key], args.max_seconds)}; shapes {", ".join(specs[key]["shapes"][:4])}')
    for row in over:
        print(f'FAILED time model {row["label"]} {row["kind"]} {row["phase"]} sm_{row["arch"]} {row["dtype"]}: '
              f'{"; ".join(row["problems"])}')
    return 1 if failed or missing or over else 0


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


def sass_summary(specs: Dict[str, dict], results: Dict[str, dict]) -> List[str]:
    """Per kernel and target: the largest and smallest key-loop ratio to the plain flash kernel, half-precision
    rows (float32 rows where a kernel has none)."""
    groups: Dict[Tuple[str, int], List[float]] = {}
    for key, spec in specs.items():
        if spec['dtype'] in SASS_LIMITED_DTYPES and priced(spec['desc']):
            ratio = sass_ratio(spec, results[key])
            groups.setdefault((spec['desc']['kernel'], spec['desc']['arch']), []).append(ratio)
    lines = []
    for (kernel, arch), ratios in sorted(groups.items()):
        limit = SASS_LIMITS.get(kernel)
        lines.append(f'key-loop SASS per score against plain flash, {kernel} sm_{arch} (fp16, bf16): '
                     f'{min(ratios):.2f}x to {max(ratios):.2f}x'
                     + (f' (limit {limit:g}x)' if limit else ' (no limit)'))
    return lines


def sass_table(specs: Dict[str, dict], results: Dict[str, dict], order) -> List[str]:
    """The --sass section of the page: each row's key-loop instructions per score by class."""
    classes = sass_cost.CLASSES
    lines = ['## Key-loop SASS per score', '',
             'One iteration of each kernel\'s key loop (the innermost loop holding the matrix products), as '
             '`cuobjdump -sass` lays it out (where some key rows run in a loop of their own, the longest, that loop '
             'for its share of the iterations on the row\'s first shape and the next longest for the rest): warp '
             'instructions per score by class, their total, the plain flash '
             'kernel\'s total at the same tiles, warps, stages, dtype and target (`tools/flash_reference.py`, '
             '`ragged`: its masked variant, for a sequence that is not a multiple of the other block), the ratio, '
             'and the loops inside the key loop (each counted once: where there are any, the row is a lower '
             'bound). `real`: the share of the computed scores that are real, ours and flash\'s over the same '
             'sequence with the same blocks, on the row\'s first shape; `x per real`: the ratio per real score. '
             '`K/V B`: bytes of the other tokens\' two operands read per score. Limits (`--sass-limit`) apply to '
             'half precision, per score.', '',
             '| kernel | arch | dtype | tiles and constexprs | warps | stages | ' + ' | '.join(classes)
             + ' | all | flash | x flash | limit | real | x per real | K/V B | inner loops | launched by |',
             '|---|---:|---|---|---:|---:|' + '---:|' * (len(classes) + 4) + '---|---:|---:|---:|---|']
    for key in sorted(specs, key=order):
        spec, result, d = specs[key], results[key], specs[key]['desc']
        if 'sass' not in result:
            continue
        loop = key_loop(spec, result)
        cells = [f'{per_score(spec, loop[cls]):.2f}' for cls in classes + ('all', )]
        flash = result.get('flash', {}).get('all')
        variant = ' ragged' if ragged(spec) else ''
        cells += [f'{per_score(spec, flash):.2f}{variant}' if flash else '-', f'{sass_ratio(spec, result):.2f}']
        limit = sass_limit(spec)
        cells.append(f'{limit:g}' if limit < float('inf') else '-')
        ours, theirs = real_shares(spec)
        cells += [f'{ours:.0%} / {theirs:.0%}' if ours == ours else f'- / {theirs:.0%}',
                  f'{sass_ratio(spec, result) * theirs / ours:.2f}' if ours == ours else '-',
                  f'{kv_bytes(spec):.2f}']
        cells.append(str(result['sass']['inner']))
        lines.append(f'| `{d["kernel"]}` | {d["arch"]} | {spec["dtype"]} | {tile_text(d["constexprs"])} | '
                     f'{d["options"]["num_warps"]} | {d["options"]["num_stages"]} | {" | ".join(cells)} | '
                     f'{spec["shapes"][0]} |')
    return lines + ['']


def write_markdown(path: str, specs: Dict[str, dict], results: Dict[str, dict], max_seconds: float, command: str,
                   summary: List[str], sass: bool = False, model_rows: Optional[List[dict]] = None) -> None:
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
    if model_rows:
        lines += model_markdown(model_rows)
    if sass:
        lines += sass_table(specs, results, order) + ['## Specializations', '']
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
    rows = next((c[name] for name in ('BLOCK_W', 'BLOCK') if name in c), None)  # the tables' and parts' passes
    text = ['x'.join(map(str, flash_reference.tiles(c)))] if rows is None else [f'row{rows}']
    text += [f'{name}={c[name]}' for name in ('W', 'WW', 'HH', 'COLS', 'COLS_V', 'COLS_H', 'BLOCK_V', 'BLOCK_H')
             if name in c]
    text += [name.lower() for name in ('V2H', 'H2V') if c.get(name)]
    text += [f'{name[6:].lower()}{c[name]}' for name in ('BLOCK_D', 'BLOCK_DV', 'BLOCK_X') if name in c]
    text += ['keys'] * bool(c.get('KEYS')) + ['both'] * bool(c.get('BOTH'))
    text += [name.lower() for name in ('COLUMNS', 'SIGNED', 'LSE_GIVEN', 'FOLD', 'FOLD_V', 'FOLD_H', 'WRITE_TABLES',
                                       'WRITE_LSE', 'ONE_BLOCK') if c.get(name)]
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
    exact = spec.get('desc', {}).get('constexprs', {}).get('PRECISION') == 'ieee'  # float32 data (the scan)
    products = 'PRECISION' in spec.get('desc', {}).get('constexprs', {'PRECISION': None})
    if spec.get('dtype') in TENSOR_CORE_DTYPES and products and not exact and result.get('mma', 1) == 0:
        problems.append('no tensor-core instruction in the SASS (the products run on the FMA units)')
    limit = spec.get('sass_limit', float('inf'))
    ratio = sass_ratio(spec, result)
    if limit < float('inf') and not ratio <= limit:  # NaN (no key loop found) fails too
        problems.append(f'key loop {ratio:.2f}x the plain flash kernel\'s SASS > {limit:g}x')
    return '; '.join(problems) or 'ok'


def sass_cells(spec: dict, result: dict) -> Tuple[str, str]:
    """(instructions per score, ratio to the plain flash kernel) as printed."""
    if 'sass' not in result:
        return '-', '-'
    return f'{per_score(spec, key_loop(spec, result)["all"]):.2f}', f'{sass_ratio(spec, result):.2f}'


def format_row(spec: dict, result: dict, max_seconds: float, sass: bool = False) -> str:
    desc = spec['desc']
    extra = ' {:>10} {:>8} '.format(*sass_cells(spec, result)) if sass else ''
    c = desc['constexprs']
    tiles = tile_text(c)
    if 'error' in result:
        return (f'{desc["kernel"]:<14} {desc["arch"]:>4} {spec["dtype"]:<5} {spec["phase"]:<5} {tiles:<44} '
                f'{desc["options"]["num_warps"]:>5} {desc["options"]["num_stages"]:>6} {"-":>9} {"-":>4} {"-":>7} '
                f'{"-":>5} '
                f'{result["seconds"]:>5.1f}{extra}  {status(spec, result, max_seconds)}')
    return (f'{desc["kernel"]:<14} {desc["arch"]:>4} {spec["dtype"]:<5} {spec["phase"]:<5} {tiles:<44} '
            f'{desc["options"]["num_warps"]:>5} {desc["options"]["num_stages"]:>6} {result["shared"] / 1024:>9.1f} '
            f'{result["registers"]:>4} {result["spill"]:>7} {result["async_copies"]:>5} {result["seconds"]:>5.1f}'
            f'{extra}  '
            f'{status(spec, result, max_seconds)}{" (cached)" if result.get("cached") else ""}')


if __name__ == '__main__':
    sys.exit(main())
