"""The launches themselves: CUDA's grid limits at any batch size, the inputs' device, and every configuration of the
launch tables executed against the float64 reference on the simulated device of each capability."""
import contextlib
import dataclasses
import functools
import math

import pytest
import torch

from mmppma import ops
from mmppma.ops import devices

from ..conftest import load_tool
from .oracle import tf32

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')

from mmppma.ops.triton_support import launch as lp  # noqa: E402


def table(cap):
    """What :func:`lp.config` returns at ``cap`` for every family, length, dtype and width."""
    return tuple(lp.config(family, length, dtype, cap, width) for family in lp.KERNEL_FAMILIES
                 for length in (1, lp.LARGE) for dtype in (torch.float32, torch.float16)
                 for width in (lp.NARROW - 1, lp.LARGE))


#: one capability per distinct launch table: a launch's grid follows from its configuration and shape alone
DISTINCT_TABLES = sorted({table(cap): cap for cap in reversed(devices.CAPABILITIES)}.values())


@pytest.mark.parametrize('cap', DISTINCT_TABLES)
def test_grids_stay_within_cuda_limits_at_batch_1024(cap):
    """Every backbone's attention at 800 x 1344, 1024 images: every grid within CUDA's limits, programs > 65535."""
    largest, check_kernels = {}, load_tool('check_kernels.py')
    for _, kind, shape in check_kernels.model_shapes(['det_800x1344'], list(check_kernels.MODELS)):
        for dtype in (torch.float32, torch.float16):
            for _, launch in check_kernels.record(kind, (1024, *shape[1:]), dtype, cap):
                assert all(n <= limit for n, limit in zip(launch.grid, lp.GRID_LIMITS)), (launch.name, launch.grid)
                largest[launch.name] = max(largest.get(launch.name, 0), math.prod(launch.grid))
    attention = {'_whole_fwd', '_whole_bwd', '_line_fwd', '_line_bwd', '_ppmla_fwd', '_ppmla_bwd'}
    # and PPMA's decay tables (B * heads), the half-precision forward's column-table parts (stage 3's V2H path), and
    # the chunked form's passes and walks (MLLA's stages 1 and 2)
    chunked = {'_queries', '_update', '_grad_queries', '_grad_keys', '_update_queries'}
    assert set(largest) == attention | {'_tables_fwd', '_tables_bwd', '_whole_fwd_parts'} | chunked
    assert all(largest[name] > 65535 for name in attention | chunked), largest


def test_half_precision_lines_take_the_long_tiles_where_they_pad_no_more():
    """Criss-cross lines below LARGE tokens take the long row's 64 own tokens on sm_90 where 32 would pad as much:
    lines of 56, 100 and 168 tokens (the configs' 224 and 800 x 1344 maps), not 28, 200 or 336; sm_80 in the
    forward, and in the backward at head dims up to 16 on lines longer than 64 tokens (not knowing the head dim, the
    short row); float32 keeps the short row. Whole attention's half-precision kernels on sm_80 and sm_90 take the
    long row from 128 tokens (14 x 14 maps and larger; 7 x 7 keeps the short row), with 64 own tokens; narrow maps
    too where they are no taller than 16 (a 3 x 100 map's narrow side keeps the narrow tiles)."""
    half = {n: lp.long_tiles('line_fwd', n, torch.float16, 90) for n in (28, 56, 100, 168, 200, 336, 1024)}
    assert half == {28: False, 56: True, 100: True, 168: True, 200: False, 336: False, 1024: True}
    assert lp.config('line_bwd', 168, torch.bfloat16, 90) == lp.config('line_bwd', lp.LARGE, torch.bfloat16, 90)
    assert not lp.long_tiles('line_fwd', 168, torch.float32, 90)
    assert lp.long_tiles('line_fwd', 168, torch.float16, 80)
    backward_80 = {(n, d): lp.long_tiles('line_bwd', n, torch.float16, 80, d)
                   for n in (56, 128, 168, 512) for d in (16, 32, None)}
    assert {key for key, long in backward_80.items() if long} == {(128, 16), (168, 16), (512, 16)}
    for family in ('whole_fwd', 'whole_bwd_q', 'whole_bwd_kv'):
        whole = {n: lp.long_tiles(family, n, torch.bfloat16, 90) for n in (49, 127, 128, 196, 256)}
        assert whole == {49: False, 127: False, 128: True, 196: True, 256: True}, family
        assert not any(lp.long_tiles(family, 196, dtype, cap) for dtype, cap in ((torch.float32, 90),
                                                                                  (torch.float16, 86)))
    narrow = lp.config('whole_bwd_q', 1, torch.bfloat16, 90, 1)
    assert lp.config('whole_bwd_q', 196, torch.bfloat16, 90, 14) != narrow
    assert lp.config('whole_bwd_q', 300, torch.bfloat16, 90, 3) == narrow
    q = torch.empty(8, 4, 14, 14, 32, dtype=torch.bfloat16, device='meta', requires_grad=True)
    with lp.recording(90) as ran:
        ops.ppma_attention(q, q, q, *(torch.empty(8, 4, 14, 14, device='meta'), ) * 2, impl='triton').sum().backward()
    tiles = [(x.name, x.constexprs.get('BLOCK_M', x.constexprs.get('BLOCK_OWN')), x.config.num_warps) for x in ran
             if x.name in ('_whole_fwd', '_whole_bwd')]
    # the backward's queries and keys take the same tiles here: one launch holds both roles
    assert tiles == [('_whole_fwd', 64, 4), ('_whole_bwd', 64, 4)], tiles


@pytest.mark.parametrize('hw, d, passes', [
    ((20, 24), 16, [(False, True, 16), (True, False, 32), (False, False, 32)]),
    # sm_90's 32-token row blocks at head dim 32: 64 value channels would spill the keys' programs (32 B)
    ((50, 84), 32, [(False, False, 32)] * 2 + [(True, False, 64)] + [(False, False, 32)] * 2)])
def test_release_criss_cross_backward_takes_both_row_passes_in_one(hw, d, passes):
    """Form 'release' (rows, columns over twice the value channels, rows again) on sm_90: its backward runs the last
    row pass's value gradient alone (keys' programs, VALUES_ONLY), the column pass's backward, then one row backward
    over both row passes' value channels (twice v's): three line passes of score gradients become two. Where that
    would spill (:func:`~mmppma.ops.line.triton_impl.merges_row_passes`) each pass has its backward, last first."""
    q = torch.empty(2, 2, *hw, d, dtype=torch.bfloat16, device='meta', requires_grad=True)
    tables = torch.empty(2, 2, *hw, device='meta')
    with lp.recording(90) as ran:
        ops.criss_cross_attention(q, q, q, tables, tables, scale=0.25, form='release', impl='triton').sum().backward()
    got = [(x.constexprs['COLUMNS'], x.constexprs['VALUES_ONLY'], x.constexprs['BLOCK_X']) for x in ran
           if x.name == '_line_bwd']
    assert got == passes, got


def test_a_grid_over_the_limits_is_refused():
    with pytest.raises(lp.LaunchLimitError, match=r'grid \(1, 65536\) exceeds'):
        lp.Launch(lambda: None, (1, 65536), (), {}, lp.config('scan', 1, torch.float32, 80))


def test_launches_run_on_the_inputs_device(monkeypatch):
    """Tensors on cuda:1 (fake tensors: no GPU needed) launch inside ``torch.cuda.device(cuda:1)``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mmppma.ops.scan.triton_impl import scan_launches
    from mmppma.ops.whole.triton_impl import forward_launches
    entered, during = [], []

    @contextlib.contextmanager
    def device(d):
        entered.append(torch.device(d))
        yield

    monkeypatch.setattr(torch.cuda, 'device', device)
    monkeypatch.setattr(lp.Launch, '__call__', lambda self: during.append((self.name, entered and entered[-1])))
    with FakeTensorMode():
        x = torch.empty(6, 40, 8, device='cuda:1')
        launches, _ = scan_launches(x, torch.empty(6, 40, device='cuda:1'), False, 80)
        q = torch.empty(2, 1, 5, 7, 16, device='cuda:1')
        tables = torch.empty(2, 1, 5, 7, device='cuda:1')
        launches += forward_launches(q, q, q, tables, tables, 0.25, 'release', 80)[0]
        lp.run(launches)
    assert during == [(x.name, torch.device('cuda:1')) for x in launches] and len(during) == 2


# name: (op, (B, heads, H, W, d) or a scan's (lines, L, d)), at shapes that reach every configuration of the launch
# tables: N or a line >= lp.LARGE for the large tiles, narrow images (a tall one transposed), ragged blocks, d = 64
CASES = {
    'whole 32x32': ('ppma_attention', (1, 1, 32, 32, 16)),
    'whole 3x17 d64': ('ppma_attention', (1, 1, 3, 17, 64)),
    'whole 15x3': ('ppma_attention', (1, 1, 15, 3, 16)),
    'whole 17x3': ('ppma_attention', (1, 1, 17, 3, 16)),
    'criss_cross 1x1024': ('criss_cross_attention', (1, 1, 1, 1024, 16)),
    'criss_cross 5x37': ('criss_cross_attention', (1, 1, 5, 37, 16)),
    'scan 1024': ('decay_scan_1d', (1, 1024, 8)),
    'scan 70': ('decay_scan_1d', (2, 70, 8)),
    'linear 5x7': ('ppma_linear_attention', (1, 1, 5, 7, 8)),
}
DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
# (capability, case, dtype) of the numeric runs: at each capability, runs that execute every (configuration, dtype)
# its table can return (test_the_numeric_runs_execute_every_table_configuration). At sm_86 / 89 / 90 the tall
# narrow image, the ragged criss-cross case and the float32 15 x 3 case reach no configuration the others do not.
REPEATS = {'whole 17x3', 'criss_cross 5x37', ('whole 15x3', 'fp32')}
RUNS = [(cap, case, dtype) for cap in devices.CAPABILITIES for case in CASES for dtype in DTYPES
        if cap == 80 or not {case, (case, dtype)} & REPEATS]


def make_inputs(case, dtype):
    """The case's inputs: q, k, v (or a scan's x) in ``dtype``, log-decays float32."""
    op, shape = CASES[case]
    g, n = torch.Generator().manual_seed(sum(shape)), 1 if op == 'decay_scan_1d' else 2
    xs = [(torch.randn(*shape, generator=g) * 0.5).to(dtype) for _ in range(2 * n - 1)]
    return xs + [-torch.rand(*shape[:-1], generator=g) * 0.5 for _ in range(n)]


def call(case, inputs, impl):
    op, shape = CASES[case]
    if op == 'decay_scan_1d':
        return ops.decay_scan_1d(*inputs, impl=impl)
    if op == 'ppma_linear_attention':
        return ops.ppma_linear_attention(*inputs, feature_map='elu', normalize=True, impl=impl)
    form = 'h2v' if op == 'criss_cross_attention' and shape[-2] >= lp.LARGE else 'release'  # one pass per axis
    return getattr(ops, op)(*inputs, scale=shape[-1]**-0.5, form=form, impl=impl)


def launch_params(configs):
    """Configurations as launches take them: tiles, warps, stages and registers, whatever table row (family) they
    come from (whole attention's backward runs both roles in one launch where their rows are alike)."""
    return {dataclasses.replace(c, family='') for c in configs}


def reached(cap, case, dtype):
    """The configurations the case's launches (forward and backward) take at ``cap``, recorded on meta tensors."""
    meta = [t.to('meta').requires_grad_() for t in make_inputs(case, DTYPES[dtype])]
    with lp.recording(cap) as launches:
        out = call(case, meta, 'triton')
        torch.autograd.grad(out, meta, torch.empty_like(out))
    return launch_params(x.config for x in launches)


def test_the_numeric_runs_execute_every_table_configuration():
    """For each capability the cases reach exactly the configurations its table can return, so a new table entry
    without a case fails here, and that capability's numeric runs execute every one of them in every dtype a case
    reaches it in."""
    for cap in devices.CAPABILITIES:
        configs = {(case, dtype): reached(cap, case, dtype) for case in CASES for dtype in DTYPES}
        assert set().union(*configs.values()) == launch_params(lp.table_configs(cap)), cap
        everything = {(c, dtype) for (case, dtype), found in configs.items() for c in found}
        run = {(c, dtype) for (case, dtype), found in configs.items() for c in found if (cap, case, dtype) in RUNS}
        assert run == everything, (cap, sorted(map(str, everything - run)))


@pytest.mark.heavy
@pytest.mark.slow(minutes=3)
@pytest.mark.parametrize('cap, case, dtype', RUNS, ids=lambda x: str(x))
def test_every_configuration_against_the_float64_reference(cap, case, dtype, monkeypatch):
    """The case on the simulated device of ``cap`` executes the configurations recorded for it; output and input
    gradients against the float64 reference of the same inputs: float32 (TF32 off) within 1e-4 of the reference's
    largest entry, float16 / bfloat16 within 1e-2 in relative norm."""
    if torch.cuda.is_available():
        pytest.skip('the simulated device runs CPU tensors on the interpreter')
    monkeypatch.setenv(devices.SIMULATE_VAR, str(cap))
    inputs = [t.requires_grad_() for t in make_inputs(case, DTYPES[dtype])]
    with lp.executed() as ran, tf32(False):
        out = call(case, inputs, 'auto')
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
        got = [out] + list(torch.autograd.grad(out, inputs, cotangent))
    assert launch_params(c for _, c in ran) == reached(cap, case, dtype) and {c for c, _ in ran} == {cap}
    wide = [t.detach().double().requires_grad_() for t in inputs]
    want = call(case, wide, 'reference')
    want = [want] + list(torch.autograd.grad(want, wide, cotangent.double()))
    for i, (a, b) in enumerate(zip(got, want)):
        a = a.detach().double()
        norm = (lambda t: t.abs().max()) if dtype == 'fp32' else torch.linalg.vector_norm
        err = (norm(a - b) / norm(b).clamp_min(1e-30)).item()
        assert err <= (1e-4 if dtype == 'fp32' else 1e-2) or b.abs().max() == a.abs().max() == 0, \
            f'tensor {i} (0: out): error {err:.2e}'


def _on_simulated_sm90_against_float64(monkeypatch, op, shape, dtype):
    """``op`` (taking ``impl=``) on the simulated sm_90 on random (B, heads, H, W, d) inputs of ``dtype`` and two
    log-decay tables: its output and input gradients within 1e-2 in relative norm of the float64 reference. Returns
    the (capability, config) of the launches."""
    if torch.cuda.is_available():
        pytest.skip('the simulated device runs CPU tensors on the interpreter')
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    g = torch.Generator().manual_seed(7)
    inputs = [(torch.randn(*shape, generator=g) * 0.5).to(dtype).requires_grad_() for _ in range(3)]
    inputs += [(-torch.rand(*shape[:-1], generator=g) * 0.5).requires_grad_() for _ in range(2)]
    with lp.executed() as ran:
        out = op(*inputs, impl='auto')
        cotangent = torch.randn(out.shape, generator=g).to(out.dtype)
        got = [out] + list(torch.autograd.grad(out, inputs, cotangent))
    wide = [t.detach().double().requires_grad_() for t in inputs]
    want = op(*wide, impl='reference')
    want = [want] + list(torch.autograd.grad(want, wide, cotangent.double()))
    for i, (a, b) in enumerate(zip(got, want)):
        err = (torch.linalg.vector_norm(a.detach().double() - b) / torch.linalg.vector_norm(b)).item()
        assert err <= 1e-2, f'tensor {i} (0: out): error {err:.2e}'
    return ran


@pytest.mark.heavy
@pytest.mark.slow(minutes=2)
def test_sm90_whole_attention_below_large_on_the_long_tiles_against_the_float64_reference(monkeypatch):
    """On sm_90 a 14 x 14 map's whole attention (196 tokens, narrower than NARROW) takes the long row's tiles of 64
    own tokens over 4 warps, forward and backward (both roles in one launch, recorded under the queries' row), the
    last own tile holding 4 tokens; bf16 output and input gradients within 1e-2 in relative norm of the float64
    reference."""
    ran = _on_simulated_sm90_against_float64(monkeypatch, functools.partial(ops.ppma_attention, scale=0.25),
                                             (1, 2, 14, 14, 32), torch.bfloat16)
    assert (90, lp.config('whole_fwd', lp.LARGE, torch.bfloat16, 90)) in ran
    whole = {(c.family, c.block_m, c.num_warps) for _, c in ran if c.family.startswith('whole')}
    assert whole == {('whole_fwd', 64, 4), ('whole_bwd_q', 64, 4)}, whole


@pytest.mark.heavy
@pytest.mark.slow(minutes=2)
@pytest.mark.parametrize('shape', [(1, 2, 16, 16, 32), (1, 2, 2, 128, 32)])
def test_sm90_whole_forward_key_rows_by_side_against_the_float64_reference(monkeypatch, shape):
    """On sm_90 the forward's full key tiles take the key rows above and below the query tile's apart: 16 x 16 (tiles
    of 4 rows x 16 columns, key rows between the query rows) and 2 x 128 (its V2H map in tiles of one row, query tiles
    within one row: none between; its 128 x 2 transpose in tiles of 8 rows); bf16 output and input gradients within
    1e-2 in relative norm of the float64 reference."""
    ran = _on_simulated_sm90_against_float64(monkeypatch, functools.partial(ops.ppma_attention, scale=0.25), shape,
                                             torch.bfloat16)
    assert (90, lp.config('whole_fwd', lp.LARGE, torch.bfloat16, 90)) in ran


@pytest.mark.heavy
@pytest.mark.slow(minutes=2)
@pytest.mark.parametrize('dtype', ['fp16', 'bf16'])
def test_sm90_lines_below_large_on_the_long_tiles_against_the_float64_reference(dtype, monkeypatch):
    """On sm_90 a 3 x 56 map's rows (56 tokens: one ragged 64-token tile) take the long tiles, its columns the short
    ones; output and input gradients within 1e-2 in relative norm of the float64 reference."""
    ran = _on_simulated_sm90_against_float64(
        monkeypatch, functools.partial(ops.criss_cross_attention, scale=0.25, form='release'), (1, 2, 3, 56, 16),
        DTYPES[dtype])
    long = lp.config('line_fwd', lp.LARGE, torch.float16, 90)
    assert long.block_m == 64 and long in {c for _, c in ran} and {c.block_m for _, c in ran} == {32, 64}
