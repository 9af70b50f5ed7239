"""A time model of the attention kernels' launches on a GPU, from what compiling them on a CPU shows: the key
loop's SASS by pipe class (:mod:`sass_cost`) times the scores the launch computes (padding included), under the
occupancy that its registers, shared memory and warps allow, in waves over the GPU's SMs. Used by
``tools/check_kernels.py --model``; the method, its rates and its check against a GPU run: ``docs/kernel_model.md``.

Per launch, on one SM holding ``k`` programs (CTAs) of ``warps`` warps each, a wave takes the largest of

- the issue bound: the wave's warp instructions over the SM's four schedulers, divided by the share of issue
  slots the resident warps fill (:func:`issue_efficiency`: a latency term, fitted once per GPU on flash
  attention's measured times);
- each pipe's bound: the wave's warp instructions of that class over the pipe's rate (``GPU.rates``), and the
  tensor cores' multiply-adds over ``GPU.tensor``;
- the bytes of the other tokens' operands it reads, over the L2's bandwidth.

A launch is its full waves and a last, partial one; an op call adds ``GPU.launch_us`` per launch. Only the key
loop is priced (it runs once per computed tile pair; what runs once per program is left out).
"""
import dataclasses
import math
from typing import Dict, List, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class GPU:
    """Per-SM limits and rates of one data-centre part of a compute capability."""
    name: str
    sms: int
    clock_ghz: float  #: the SM clock under load (boost)
    max_warps: int  #: resident warps per SM
    max_ctas: int  #: resident programs per SM
    shared: int  #: shared memory per SM for programs, bytes
    #: warp instructions per clock per SM by SASS class (sass_cost.CLASSES but 'mma'): 32 lanes over the pipe's
    #: lanes per clock per SM (CUDA C++ Programming Guide, "Arithmetic Instructions", throughput table)
    rates: Dict[str, float]
    #: dense tensor-core multiply-adds per clock per SM: half precision with float32 accumulation, and TF32
    tensor: Dict[str, float]
    l2_bytes: float  #: L2 read bandwidth per clock per SM, bytes
    dram_tb_s: float  #: device memory bandwidth, TB/s (the data sheet's)
    launch_us: float = 4.0  #: a launch's cost on the GPU's timeline beside its work (launch latency, drain)
    #: warps per scheduler that keep its issue slots as full as they get (:func:`issue_efficiency`): on the H200
    #: kernels at 2 and 4 warps per scheduler sat at the same share of their issue bound (docs/kernel_model.md)
    saturating_warps: float = 2.0
    #: the share of issue slots used at saturation, fitted on flash SDPA's measured forward times on the H200
    #: (:data:`H200_RUN`); the other parts take it until a GPU run measures theirs
    issue_share: float = 0.54
    registers: int = 65536


def _rates(fp32_lanes: int) -> Dict[str, float]:
    # FP32 add / multiply / FMA: 64 lanes (sm_80) or 128; MUFU (ex2, rcp, lg2) and conversions to narrower types:
    # 16; integer add, logic, shifts, compares, IMAD: 64; loads, stores and shared-memory ops: one LSU issue per
    # two clocks per scheduler; moves, shuffles, branches, barriers: the issue slot only
    return dict(fp32=fp32_lanes / 32, mufu=0.5, conv=0.5, int=2.0, mem=2.0, other=4.0)


#: capability -> the part the model assumes. Sources: SM counts, clocks and tensor peaks from NVIDIA's data sheets
#: and architecture whitepapers (A100: 312 TFLOPS dense FP16 at 1.41 GHz on 108 SMs = 1024 multiply-adds per
#: clock per SM; H100 SXM doubles that per SM; L40S and A40 run FP16 with FP32 accumulation at half A100's per-SM
#: rate; B200 doubles H100's; RTX PRO 6000 Blackwell at L40S's); CUDA-core rates from the Programming Guide's
#: throughput table; L2 bandwidth per SM from published microbenchmarks (about 5 TB/s on A100, 10 on H100); device
#: memory bandwidth from the data sheets (H100 SXM's 3.35 TB/s for sm_90: the H200 has 4.8).
GPUS: Dict[int, GPU] = {
    80: GPU('A100 SXM', 108, 1.41, 64, 32, 167936, _rates(64), dict(half=1024, tf32=512), 32.0, 2.039),
    86: GPU('A40', 84, 1.74, 48, 16, 102400, _rates(128), dict(half=512, tf32=256), 24.0, 0.696),
    89: GPU('L40S', 142, 2.52, 48, 24, 102400, _rates(128), dict(half=512, tf32=256), 24.0, 0.864),
    90: GPU('H100 / H200 SXM', 132, 1.98, 64, 32, 233472, _rates(128), dict(half=2048, tf32=1024), 40.0, 3.35),
    100: GPU('B200', 148, 1.965, 64, 32, 233472, _rates(128), dict(half=4096, tf32=2048), 40.0, 8.0),
    120: GPU('RTX PRO 6000 Blackwell', 188, 2.6, 48, 32, 102400, _rates(128), dict(half=512, tf32=256), 24.0,
          1.792),
}
#: the classes :func:`wave_cycles` prices on a pipe of their own (every class takes issue slots)
PIPES = ('fp32', 'mufu', 'conv', 'int', 'mem')


def occupancy(gpu: GPU, registers: int, shared: int, warps: int) -> Tuple[int, str]:
    """(programs resident per SM, the resource that limits them): registers are allocated per warp in units of
    256 (8 per thread), shared memory per program with 1 KB reserved."""
    per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    limits = dict(registers=gpu.registers // (per_warp * warps), warps=gpu.max_warps // warps,
                  shared=gpu.shared // (shared + 1024), programs=gpu.max_ctas)
    limit = min(limits, key=lambda name: limits[name])
    return max(limits[limit], 0), limit


def issue_efficiency(gpu: GPU, warps_per_sm: float) -> float:
    """The share of issue slots the resident warps fill: the saturated share times min(1, warps per scheduler over
    those that saturate it). A warp waits on its own results (tensor products, exponentials, loads, the row
    maxima's shuffles); others fill the slots meanwhile."""
    return gpu.issue_share * min(1.0, warps_per_sm / 4 / gpu.saturating_warps)


def tensor_rate(gpu: GPU, dtype: str) -> float:
    return gpu.tensor['tf32' if dtype in ('tf32', 'fp32') else 'half']


@dataclasses.dataclass
class LaunchCost:
    """A launch's predicted time and what it follows from."""
    programs: int
    iterations: float  #: key-loop iterations per program (the mean over its parts')
    computed: float  #: scores computed (padding included)
    real: float  #: real scores
    resident: int  #: programs per SM
    limit: str  #: what limits ``resident``
    waves: float
    bound: str  #: what bounds a wave: 'issue', a pipe class, 'tensor' or 'l2'
    cycles: float  #: of the whole launch
    us: float  #: predicted time of the work (an op call adds ``GPU.launch_us`` per launch)


def launch_cost(gpu: GPU, loop: Dict[str, float], dtype: str, warps: int, registers: int, shared: int,
                tiles: Tuple[int, int, int, int], kv_bytes: float, real: float) -> LaunchCost:
    """The predicted time of one launch: ``loop`` the key loop's instructions per warp by class (and 'tensor':
    multiply-adds per warp) of one iteration; ``tiles`` (programs, iterations per program, own tokens, other
    tokens) of a tile; ``kv_bytes`` the other tokens' operand bytes per computed score."""
    return parts_cost(gpu, [(loop, tiles, kv_bytes, real)], dtype, warps, registers, shared)


def parts_cost(gpu: GPU, parts: List[Tuple[Dict[str, float], Tuple[int, int, int, int], float, float]], dtype: str,
               warps: int, registers: int, shared: int) -> LaunchCost:
    """The predicted time of one launch whose programs are of several parts (whole attention's paths, the
    backward's roles): ``parts`` as :func:`launch_cost`'s (loop, tiles, kv_bytes, real). Their programs share the
    grid, so they fill waves together: the waves are those of all of them, each program at their mean work."""
    programs = sum(tiles[0] for _, tiles, _, _ in parts)
    per_program = {cls: 0.0 for cls in PIPES + ('mma', 'other')}
    tensor = l2 = computed = real = 0.0
    for loop, (count, iterations, own, other), kv_bytes, part_real in parts:
        share = count / max(programs, 1)
        for cls in per_program:
            per_program[cls] += share * loop.get(cls, 0) * warps * iterations
        tensor += share * loop.get('tensor', 0) * warps * iterations
        l2 += share * kv_bytes * own * other * iterations
        computed += float(count) * iterations * own * other
        real += part_real
    resident, limit = occupancy(gpu, registers, shared, warps)
    resident = max(resident, 1)
    per_wave = resident * gpu.sms
    full, rest = divmod(programs, per_wave)
    cycles, bound = wave_cycles(gpu, per_program, tensor, l2, resident, warps, dtype)
    total = full * cycles
    if rest:
        last, last_bound = wave_cycles(gpu, per_program, tensor, l2, math.ceil(rest / gpu.sms), warps, dtype)
        total += last
        bound = bound if full else last_bound
    iterations = sum(count * part_iterations for _, (count, part_iterations, _, _), _, _ in parts) / max(programs, 1)
    return LaunchCost(programs, iterations, computed, real, resident, limit, programs / per_wave, bound, total,
                      total / (gpu.clock_ghz * 1e3))


def memory_us(gpu: GPU, nbytes: float) -> float:
    """The predicted time of a launch that only moves ``nbytes`` through device memory (an elementwise pass)."""
    return nbytes / (gpu.dram_tb_s * 1e6)


def wave_cycles(gpu: GPU, per_program: Dict[str, float], tensor: float, l2: float, programs: int, warps: int,
                dtype: str) -> Tuple[float, str]:
    """(cycles, bound) of ``programs`` programs on one SM, each issuing ``per_program`` warp instructions by class
    (all of its warps together), ``tensor`` tensor multiply-adds and ``l2`` bytes read."""
    total = sum(per_program.values()) * programs
    bounds = dict(issue=total / (4 * issue_efficiency(gpu, programs * warps)))
    bounds.update({cls: per_program[cls] * programs / gpu.rates[cls] for cls in PIPES})
    bounds['tensor'] = tensor * programs / tensor_rate(gpu, dtype)
    bounds['l2'] = l2 * programs / gpu.l2_bytes
    bound = max(bounds, key=lambda name: bounds[name])
    return bounds[bound], bound


# ---- tiles: what a launch computes -------------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _map_tiles(bh: int, rows: int, cols: int, own: int, other: int, chunk: Optional[int], consecutive: bool):
    """(programs, iterations, own, other) of own tiles of ``own`` consecutive map tokens (``consecutive``) or of
    ``own`` columns of one map row against the map's tokens in tiles of ``other``: (other // chunk rows x chunk
    columns) blocks, column chunk by column chunk, or (chunk None) blocks of ``other`` consecutive tokens."""
    programs = bh * (_cdiv(rows * cols, own) if consecutive else rows * _cdiv(cols, own))
    if chunk:
        iterations = _cdiv(cols, chunk) * _cdiv(rows, other // chunk)
    else:
        iterations = _cdiv(rows * cols, other)
    return programs, iterations, own, other


def _shifted_iterations(rows: int, cols: int, own: int, other: int, chunk: int) -> Optional[float]:
    """The forward's key-tile iterations per program, the mean over its query tiles, where its key tiles start one
    row below each query tile's first (:func:`mmppma.ops.whole.triton_impl.shifted_key_tiles`); None elsewhere."""
    from mmppma.ops.whole.triton_impl import shifted_key_tiles
    if not shifted_key_tiles(rows, cols, chunk, other, own):
        return None
    key_rows, queries = other // chunk, _cdiv(rows * cols, own)
    starts = [tile * own // cols + 1 for tile in range(queries)]
    return _cdiv(cols, chunk) * sum(_cdiv(a, key_rows) + _cdiv(rows - a, key_rows) for a in starts) / queries


def tiles(desc: dict, h: int, w: int, bh: int) -> List[Tuple[str, Tuple[int, int, int, int]]]:
    """Per part of a launch (a path of whole attention; the launch itself otherwise): (name, (programs, iterations
    per program, own tokens, other tokens)) on an h x w map with ``bh`` slices. Raises KeyError for kernels without
    an attention key loop."""
    kernel, c = desc['kernel'], desc['constexprs']
    if kernel == '_whole_fwd':  # query tiles of BLOCK_M consecutive map tokens, or (BLOCK_V / BLOCK_H) of one row
        parts = []
        for path, on, own, chunk in (('v2h', c['V2H'], c.get('BLOCK_V'), c.get('COLS_V')),
                                     ('h2v', c['H2V'], c.get('BLOCK_H'), c.get('COLS_H'))):
            if on:
                rows, cols = (h, w) if path == 'v2h' else (w, h)
                tile = _map_tiles(bh, rows, cols, own or c['BLOCK_M'], c['BLOCK_N'], chunk, 'BLOCK_M' in c)
                if 'BLOCK_M' in c and c.get('SCORES_LAYOUT'):
                    tile = (tile[0], _shifted_iterations(rows, cols, c['BLOCK_M'], c['BLOCK_N'], chunk)
                            or tile[1]) + tile[2:]
                parts.append((path, tile))
        return parts
    if kernel == '_whole_bwd':  # own tiles of BLOCK_OWN consecutive map tokens, or (BLOCK_V / BLOCK_H) of one row
        parts = []
        for keys in bwd_roles(c):  # a launch of both roles: the queries' paths, then the keys'
            for path in ('v2h', 'h2v'):
                if c[path.upper()]:
                    image = (path == 'v2h') != keys
                    rows, cols = (h, w) if image else (w, h)
                    own, chunk = (c.get('BLOCK_V'), c['COLS_V']) if image else (c.get('BLOCK_H'), c['COLS_H'])
                    parts.append((f'{path} keys' if keys and c.get('BOTH') else path,
                                  _map_tiles(bh, rows, cols, own or c['BLOCK_OWN'], c['BLOCK_OTHER'], chunk,
                                             'BLOCK_OWN' in c)))
        return parts
    if kernel in ('_line_fwd', '_line_bwd'):  # a backward launch of both roles: the queries', then the keys'
        length, lines = (h, w) if c['COLUMNS'] else (w, h)
        own = c.get('BLOCK_M', c.get('BLOCK_OWN'))
        other = c.get('BLOCK_N', c.get('BLOCK_OTHER'))
        tile = (bh * lines * _cdiv(length, own), _cdiv(length, other), own, other)
        roles = bwd_roles(c) if 'KEYS' in c else (False, )
        return [('lines keys' if keys and c.get('BOTH') else 'lines', tile) for keys in roles]
    if kernel in ('_flash_fwd', '_flash_bwd'):  # over sequences of h * w tokens
        n = h * w
        own = c.get('BLOCK_M', c.get('BLOCK_OWN'))
        other = c.get('BLOCK_N', c.get('BLOCK_OTHER'))
        return [('flash', (bh * _cdiv(n, own), _cdiv(n, other), own, other))]
    raise KeyError(kernel)


def _tile_share(rows: int, cols: int, own: int, key_rows: int, counted) -> float:
    """The share of other-tile iterations on a rows x cols map that ``counted(top, bottom, first, last)`` counts:
    own tiles of ``own`` consecutive map tokens (map rows ``first`` to ``last``) against tiles of ``key_rows`` map
    rows (``top`` to ``bottom``)."""
    tiles, hit = _cdiv(rows * cols, own), 0
    for tile in range(tiles):
        first, last = tile * own // cols, (min(tile * own + own, rows * cols) - 1) // cols
        hit += sum(bool(counted(r0, r0 + key_rows - 1, first, last)) for r0 in range(0, rows, key_rows))
    return hit / (tiles * _cdiv(rows, key_rows))


def between_share(rows: int, cols: int, own: int, key_rows: int) -> float:
    """The share of a forward's key-tile iterations that lie between its query tile's map rows: a tile being
    between where it neither ends on or above the query tile's first row nor starts on or below its last (whole
    attention's forward runs those in a loop of their own)."""
    return _tile_share(rows, cols, own, key_rows, lambda top, bottom, first, last: not (bottom <= first or top >= last))


def own_rows_share(rows: int, cols: int, own: int, key_rows: int) -> float:
    """The share of a backward's other-tile iterations that hold one of its own tile's map rows (whole attention's
    queries' programs run those in a loop of their own: the corners' sums)."""
    return _tile_share(rows, cols, own, key_rows, lambda top, bottom, first, last: top <= last and bottom >= first)


def bwd_roles(c: dict) -> Tuple[bool, ...]:
    """The roles (KEYS) whose programs a backward launch holds (whole or line attention), in the pricing's order."""
    return (False, True) if c.get('BOTH') else (bool(c['KEYS']), )


def real_scores(desc: dict, h: int, w: int, bh: int) -> float:
    """The real scores of one part of a launch (a path of whole attention, a launch of line attention): every
    (own, other) token pair on the map or line, each once."""
    kernel, c = desc['kernel'], desc['constexprs']
    if kernel.startswith('_line'):
        length, lines = (h, w) if c['COLUMNS'] else (w, h)
        return float(bh) * lines * length * length
    return float(bh) * (h * w) ** 2


# ---- flash attention's tiles -------------------------------------------------------------------------------------

#: FlashAttention-2's tiles for a sequence: (own, other, warps, stages) at 1024 tokens or more, and below
FLASH_TILES = {True: (128, 64, 8, 3), False: (64, 64, 4, 2)}


def flash_tiles(sequence: int) -> Tuple[int, int, int, int]:
    return FLASH_TILES[sequence >= 1024]



# ---- the check against a GPU run ---------------------------------------------------------------------------------

#: The second H200 run (docs/gpu_runs.md): the kernels of commit 2e28041 compiled by triton 3.6.0, bf16, 2 images at
#: 800 x 1344; whole op calls, median of 10, in ms: (label, kind) -> (fwd, fwd+bwd, SDPA fwd, SDPA fwd+bwd), SDPA
#: being flash ``scaled_dot_product_attention`` over the same tokens without a mask
H200_RUN = {
    ('det_800x1344/ppma_t/stage1', 'cc'): (0.933, 4.473, 22.922, 83.183),
    ('det_800x1344/ppma_t/stage2', 'cc'): (0.545, 2.905, 1.430, 5.335),
    ('det_800x1344/ppma_t/stage3', 'whole'): (1.956, 7.763, 0.228, 0.862),
    ('det_800x1344/ppma_t/stage4', 'whole'): (0.596, 2.409, 0.102, 0.565),
    ('det_800x1344/rmt_t/stage1', 'rmt_cc'): (0.666, 2.829, 22.959, 83.065),
    ('det_800x1344/rmt_t/stage2', 'rmt_cc'): (0.292, 2.312, 1.478, 5.366),
    ('det_800x1344/rmt_t/stage3', 'manhattan'): (1.288, 4.246, 0.220, 0.784),
    ('det_800x1344/rmt_t/stage4', 'manhattan'): (0.414, 1.901, 0.094, 0.523),
}
#: An op call's host time against SDPA's, forward and forward + backward (docs/host_cost.md, ``python
#: tools/host_cost.py``: the launches stubbed on the simulated sm_90); RMT's criss-cross takes PPMA's
HOST_RATIOS = {'whole': (4.0, 3.6), 'manhattan': (4.0, 3.9), 'cc': (6.1, 4.7), 'rmt_cc': (6.1, 4.7)}


def _fit_line(points: List[Tuple[float, float]]) -> Tuple[float, float]:
    """(slope, intercept) of the least-squares line through ``points``."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx)**2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return slope, my - slope * mx


def validate(rows: List[dict], issue_share: float, run: Optional[dict] = None) -> Tuple[dict, List[dict]]:
    """The model against a measured run (``run``, default :data:`H200_RUN`), from ``rows`` (check_kernels' --model
    rows of sm_90 bf16 priced at ``issue_share``): the issue share and SDPA's call overhead fitted on the SDPA rows
    alone (flash's predicted issue-bound time against SDPA's measured forward, stages 3 and 4; the forward and
    backward's overhead at that share), then each op call predicted as its kernels at that share plus its host time
    (:data:`HOST_RATIOS` times SDPA's overhead). Returns (fit, per call and phase: predicted and measured ms,
    ratios to SDPA)."""
    run = H200_RUN if run is None else run
    by_call = {(row['label'], row['kind'], row['phase']): row for row in rows
               if row['arch'] == 90 and row['dtype'] == 'bf16'}
    fit = {}
    for index, phase in enumerate(('fwd', 'fwd+bwd')):
        points = []
        for (label, kind), measured in run.items():
            if kind in ('whole', 'manhattan') and (label, kind, 'fwd') in by_call:
                flash = sum(by_call[label, kind, p]['flash'] for p in (('fwd', ) if index == 0 else ('fwd', 'bwd')))
                points.append((flash * issue_share / 1e3, measured[2 + index]))
        if len(points) < 2:
            raise ValueError('the H200 check needs the rows of stages 3 and 4 of whole or Manhattan attention: '
                             '--shapes det_800x1344 --models ppma_t rmt_t --dtype bf16 --arch 90')
        if index == 0:
            slope, overhead = _fit_line(points)
            share = 1 / slope
        else:  # the forward's share; the overhead of a forward and backward call
            overhead = sum(y - x / share for x, y in points) / len(points)
        fit[phase] = dict(issue_share=share, overhead_ms=overhead, points=len(points))
    out = []
    for (label, kind), measured in run.items():
        if (label, kind, 'fwd') not in by_call or (label, kind, 'bwd') not in by_call:
            continue
        for index, phase in enumerate(('fwd', 'fwd+bwd')):
            parts = ('fwd', ) if index == 0 else ('fwd', 'bwd')
            scale = issue_share / share / 1e3
            kernels = sum(by_call[label, kind, p]['ours'] for p in parts) * scale
            flash = sum(by_call[label, kind, p]['flash'] for p in parts) * scale
            overhead = fit[phase]['overhead_ms']
            ours = kernels + HOST_RATIOS[kind][index] * overhead
            sdpa = flash + overhead
            row = dict(label=label, kind=kind, phase=phase, ours=ours, measured=measured[index], kernels=kernels,
                       error=ours / measured[index] - 1)
            if kind in ('whole', 'manhattan'):  # SDPA over the same tokens: the ratio the run measured
                row.update(sdpa=sdpa, sdpa_measured=measured[2 + index], ratio=ours / sdpa,
                           ratio_measured=measured[index] / measured[2 + index])
                row['ratio_error'] = row['ratio'] / row['ratio_measured'] - 1
            out.append(row)
    return fit, out
