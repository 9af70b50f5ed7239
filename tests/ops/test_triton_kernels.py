"""Every Triton kernel against the dense reference, output and all gradients, float32; fp16 / bf16 vs float32;
the launches and the int64 offsets (without a GPU on ``TRITON_INTERPRET=1``, tests/conftest.py)."""
import dataclasses
from functools import partial

import pytest
import torch

from mmppma import ops

from .oracle import inputs, out_and_grads

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mmppma.ops.triton_support import launch as lp  # noqa: E402
from mmppma.ops.triton_support.tiles import slice_offset  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


def on_device(*ts):
    return [t.to(DEVICE).requires_grad_() for t in ts]


def make(b, heads, h, w, d, dv=None, seed=0):
    """q, k, v and la, lb (float32) on DEVICE, requiring grad."""
    return on_device(*inputs(b, heads, h, w, d, seed, torch.float32, dv))


def assert_same(op, leaves, rtol=2e-4, atol=2e-5):
    """``op(*leaves, impl='triton')`` against ``impl='reference'``: the output and every leaf's gradient."""
    got, want = (out_and_grads(partial(op, impl=impl), leaves) for impl in ('triton', 'reference'))
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f'tensor {i} (0: out): {m}')


def launched(monkeypatch):
    """The list that every launch the ops run from now on is appended to (and still run)."""
    ran, run = [], lp.run
    monkeypatch.setattr(lp, 'run', lambda launches: run(ran.extend(launches) or launches))
    return ran


WHOLE_SHAPES = [(2, 2, 7, 7, 16, 16), (1, 1, 14, 14, 32, 32), (1, 1, 5, 37, 16, 8), (1, 1, 1, 9, 16, 16),
                (1, 1, 9, 1, 64, 16), (1, 1, 3, 5, 4, 3), (1, 1, 21, 3, 16, 8)]
LINE_SHAPES = [(1, 2, 7, 7, 16, 16), (1, 1, 5, 37, 16, 8), (1, 1, 1, 9, 16, 16), (1, 1, 9, 1, 32, 16),
               (1, 1, 35, 3, 16, 16)]
SCAN_LENGTHS = [1, 5, 32, 33, 70]
LOG_DECAY = torch.tensor([-0.1, -0.4, -1.2], device=DEVICE)
# name: (op taking impl=, a function making its inputs)
KERNEL_CASES = {
    **{f'{name} {form} {"x".join(map(str, s))}': (partial(op, scale=s[4]**-0.5, form=form),
                                                 partial(make, *s, seed=s[2] * s[3]))
       for name, op, shapes in (('whole', ops.ppma_attention, WHOLE_SHAPES),
                                ('criss_cross', ops.criss_cross_attention, LINE_SHAPES))
       for s in shapes for form in ('release', 'v2h', 'h2v')},
    'manhattan': (lambda *a, impl: ops.manhattan_attention(*a, LOG_DECAY, scale=0.25, impl=impl),
                  lambda: make(2, 3, 5, 6, 16)[:3]),
    # rows of three blocks and more: own blocks with other tokens before, in and after them, the last block ragged
    'criss_cross release 2x70': (partial(ops.criss_cross_attention, scale=0.25, form='release'),
                                 partial(make, 1, 1, 2, 70, 16, 8, seed=5)),
    'rmt_criss_cross': (lambda *a, impl: ops.rmt_criss_cross_attention(*a, LOG_DECAY, scale=0.25, impl=impl),
                        lambda: make(2, 3, 5, 6, 16)[:3]),
    **{f'decay_scan {n}': (ops.decay_scan_1d, lambda n=n: on_device(torch.randn(3, n, 5), -torch.rand(3, n)))
       for n in SCAN_LENGTHS},
    **{f'matvec {form}': (partial(ops.polyline_mask_matvec, form=form), lambda: make(1, 2, 7, 7, 4, seed=3)[2:])
       for form in ('v2h', 'h2v', '2d')},
    'linear': (partial(ops.ppma_linear_attention, feature_map='elu', normalize=True),
               lambda: make(1, 2, 7, 7, 4, seed=3)),
    'matvec_3d': (ops.polyline_mask_matvec_3d, lambda: on_device(torch.randn(1, 2, 2, 3, 4, 3),
                                                                 *(-torch.rand(1, 2, 2, 3, 4) for _ in range(3)))),
    # the backward folds the log-normaliser divided by the scale into a product: zero and negative scales
    **{f'whole scale {scale}': (partial(ops.ppma_attention, scale=scale), lambda: make(1, 1, 5, 7, 16, seed=3))
       for scale in (0.0, -0.5)},
}


@pytest.mark.parametrize('name', KERNEL_CASES)
def test_kernel_equals_reference(name):
    op, inputs = KERNEL_CASES[name]
    assert_same(op, inputs())


def test_whole_forward_runs_h2v_as_v2h_on_the_transposed_map():
    """The forward runs every path in one launch, each as V2H on its map: the image's for 'v2h' (map width W), its
    transpose's for 'h2v' (map width H), in query tiles of consecutive map tokens (spanning map rows): the block
    that pads the map least, one program per tile and slice."""
    from mmppma.ops.whole.triton_impl import query_block
    cap = lp.capability(torch.device(DEVICE))
    for shape in WHOLE_SHAPES:
        q, k, v, la, lb = (t.detach().to('meta') for t in make(*shape))
        with lp.recording(cap) as ran:
            ops.ppma_attention(q, k, v, la, lb, impl='triton')
        h, w = shape[2:4]
        if w < lp.NARROW <= h:  # the whole op runs on the transpose
            h, w = w, h
        forward = [x for x in ran if x.name == '_whole_fwd']
        assert [(x.constexprs['WW'], x.constexprs['HH'], x.grid[1]) for x in forward] == [(w, h, 2)], shape
        block_m = query_block(h * w, lp.config('whole_fwd', h * w, torch.float32, cap).block_m)
        assert [(x.constexprs['BLOCK_M'], x.grid[0]) for x in forward] == [
            (block_m, shape[0] * shape[1] * -(-h * w // block_m))], shape
    assert [query_block(width, 64) for width in (7, 14, 25, 42, 50, 84, 128)] == [16, 16, 32, 16, 64, 32, 64]
    # half precision on 1024 tokens or more: 64 rows at least, whatever the padding
    assert [query_block(width, 64, least=64) for width in (14, 42, 84, 128)] == [64, 64, 64, 64]
    q = torch.empty(2, 8, 50, 84, 32, dtype=torch.bfloat16, device='meta')
    with lp.recording(90) as ran:
        ops.ppma_attention(q, q, q, *(torch.empty(2, 8, 50, 84, device='meta'), ) * 2, impl='triton')
    # 4200 tokens in 66 tiles of 64 (the last holds 40)
    assert [(x.constexprs['BLOCK_M'], x.grid) for x in ran if x.name == '_whole_fwd'] == [(64, (16 * 66, 2))]


@pytest.mark.parametrize('version', [(3, 7), (3, 6)])
def test_whole_forward_plans_by_triton_version(monkeypatch, version):
    """Under triton 3.7 or later the forward's key tiles take the column count whose tiles compute the fewest
    scores, whether or not it divides the tile (the places past rows x columns stay empty): 9 x 13 runs H2V (its map
    13 x 9) in tiles of 3 rows x 10 columns, 3 x 40 runs V2H in 10 columns, and full tiles hold a column chunk's
    tiles in the scores' layout. Under triton 3.6 they take powers of two and the H2V path reads its tables from
    transposed copies. Both equal the reference, gradients included."""
    from mmppma.ops.whole import triton_impl
    assert [triton_impl.key_columns(w, h, 64, pow2=False) for w, h in ((84, 50), (50, 84), (42, 25), (25, 42))] == [
        21, 10, 21, 9]
    assert [triton_impl.key_columns(w, h, 64) for w, h in ((84, 50), (50, 84), (42, 25), (25, 42))] == [32, 8, 16, 32]
    monkeypatch.setattr(lp, 'triton_version', lambda: version)
    triton_impl._FWD_PLANS.clear()
    ran = launched(monkeypatch)
    try:
        # (COLS_V, COLS_H): the fewest computed scores, by hand
        cases = {(3, 7): [((1, 2, 9, 13, 16), (16, 10)), ((1, 2, 3, 40, 16), (10, 8))],
                 (3, 6): [((1, 2, 9, 13, 16), (16, 16))]}[version]
        for shape, cols in cases:
            assert_same(partial(ops.ppma_attention, scale=0.25), make(*shape))
            forward = [x.constexprs for x in ran if x.name == '_whole_fwd'][-1]
            assert (forward['COLS_V'], forward['COLS_H'], forward['TABLES_T'], forward['SCORES_LAYOUT']) == cols + (
                version < (3, 7), version >= (3, 7)), shape
    finally:
        triton_impl._FWD_PLANS.clear()


def test_rows_a_query_tile_spans_by_counting():
    """The forward's bound on the map rows a tile of consecutive tokens touches equals the most any tile touches,
    counted tile by tile (the key loop between the query rows is left out where it is 2 or fewer)."""
    from mmppma.ops.whole.triton_impl import tile_rows_spanned
    for width in range(1, 80):
        for block in (16, 32, 64, 128):
            counted = max((start + block - 1) // width - start // width + 1
                          for start in range(0, width * block, block))
            assert tile_rows_spanned(width, block) == counted, (width, block)


@pytest.mark.parametrize('cols, shape', [(32, (1, 1, 3, 36, 16, 8)), (16, (1, 1, 4, 20, 16, 8)),
                                         (10, (1, 1, 7, 20, 16, 8))])
def test_whole_forward_key_rows_above_and_below_the_query_tile(monkeypatch, cols, shape):
    """On full key tiles (triton 3.7) the forward takes the column segment's sign as known for the key rows on or
    above every row of the query tile and on or below them, and its absolute value only between: key tiles of one
    row on a map whose query tiles span two rows at most have none between (3 x 36's V2H map, query tiles of 16);
    tiles of one row (its 36 x 3 transpose) or two (4 x 20, both paths) with key rows between; columns past the map
    in the last chunk. Tiles that are not full (7 x 20's V2H map: 3 rows of 10, two places empty, rows past the map)
    start one row below each query tile's first, so none lies between. Forced column counts; all equal the
    reference, gradients included (the log-normaliser counts each key once)."""
    from mmppma.ops.whole import triton_impl
    key_columns = triton_impl.key_columns
    # (the backward's column chunks are powers of two: other counts are forced on the forward only, which passes pow2)
    monkeypatch.setattr(triton_impl, 'key_columns', lambda *args, **kwargs: cols if cols & (cols - 1) == 0 or (
        'pow2' in kwargs) else key_columns(*args, **kwargs))
    triton_impl._FWD_PLANS.clear()
    triton_impl._BWD_PLANS.clear()
    ran = launched(monkeypatch)
    try:
        assert_same(partial(ops.ppma_attention, scale=0.25), make(*shape, seed=cols))
        forward = [x.constexprs for x in ran if x.name == '_whole_fwd'][-1]
        assert (forward['COLS_V'], forward['COLS_H'], forward['SCORES_LAYOUT']) == (
            cols, cols, lp.triton_version() >= (3, 7))
        if cols == 10:
            assert triton_impl.shifted_key_tiles(7, 20, 10, forward['BLOCK_N'], forward['BLOCK_M'])
    finally:
        triton_impl._FWD_PLANS.clear()
        triton_impl._BWD_PLANS.clear()


@pytest.mark.parametrize('dtype, h, w, cols', [(torch.bfloat16, 8, 32, None), (torch.bfloat16, 7, 20, 10),
                                               pytest.param(torch.float16, 8, 32, None, marks=pytest.mark.heavy)])
def test_whole_forward_takes_the_column_table_in_its_products(monkeypatch, dtype, h, w, cols):
    """Half precision on full key tiles (triton 3.7): the products add the column table from its three bfloat16
    parts per key, so that the bias costs no addition per score there. On 8 x 32 (V2H: key tiles of one row of 32,
    H2V: 4 rows of 8; key rows above, between and below the query tiles) with tables down to -60, each path's output
    is as close to float64's on the same rounded inputs as the forward that adds the table per score; likewise on
    tiles that start one row below the query tile's first (7 x 20's V2H map in tiles of 3 rows of 10: keys before
    and past the map read parts of -inf in the product)."""
    from mmppma.ops.whole import triton_impl as whole

    from .oracle import whole_attention
    if lp.triton_version() < (3, 7):
        pytest.skip('full key tiles in the scores\' layout need triton 3.7')
    if cols:
        monkeypatch.setattr(whole, 'key_columns', lambda *args, **kwargs: cols)
        monkeypatch.setattr(whole, '_FWD_PLANS', {})
    forms = ('v2h', 'h2v') if cols is None else ('v2h', )
    q, k, v, la, lb = inputs(1, 2, h, w, 16, seed=3, dtype=torch.float64)
    la, lb = la * 4, lb * 4
    q, k, v = (t.to(dtype) for t in (q, k, v))
    ran = launched(monkeypatch)
    errors = {}
    for fold_tokens in (0, 1 << 30):
        monkeypatch.setattr(whole, 'FOLD_TOKENS', fold_tokens)
        for form in forms:
            got = ops.ppma_attention(q, k, v, la.float(), lb.float(), scale=0.25, form=form, impl='triton')
            forward = [x.constexprs for x in ran if x.name == '_whole_fwd'][-1]
            assert forward['FOLD_V' if form == 'v2h' else 'FOLD_H'] == (fold_tokens == 0)
            want = torch.stack([torch.from_numpy(whole_attention(*(t[0, h].double().numpy() for t in (q, k, v, la, lb)),
                                                                 0.25, form)) for h in range(2)])
            errors[fold_tokens, form] = ((got[0].double() - want).norm() / want.norm()).item()
    assert sum(x.name == '_whole_fwd_parts' for x in ran) == len(forms)
    for form in forms:
        folded, added = errors[0, form], errors[1 << 30, form]
        assert folded < 1e-2 and folded < 1.2 * added + 1e-4, (form, folded, added)


def test_whole_forward_folds_on_full_key_tiles_of_large_half_precision_maps(monkeypatch):
    """The parts' launch runs before the forward where a path folds: half precision, triton 3.7, FOLD_TOKENS map
    tokens or more, and that path's key tiles full or starting one row below the query tile's first (Cityscapes'
    stage 3, 64 x 128: both paths in tiles of one row of 64; 800 x 1344's stage 3, 50 x 84: the V2H path's tiles of 3
    x 21, not the H2V path's of 6 x 10, whose query tiles span three rows). Its grid covers every token of each path
    and slice, and the model prices its bytes (a float32 entry read, 16 bfloat16 written)."""
    from mmppma.ops.whole import triton_impl as whole

    from ..conftest import load_tool
    check_kernels = load_tool('check_kernels.py')
    monkeypatch.setattr(lp, 'triton_version', lambda: (3, 7))
    whole._FWD_PLANS.clear()

    def launches(h, w, dtype):
        q = torch.empty(1, 8, h, w, 32, dtype=dtype, device='meta')
        return whole.forward_launches(q, q, q, *(torch.empty(1, 8, h, w, device='meta'), ) * 2, 0.25, 'release',
                                      90)[0]
    try:
        parts, forward = launches(64, 128, torch.bfloat16)
        assert (parts.name, forward.name) == ('_whole_fwd_parts', '_whole_fwd')
        assert (forward.constexprs['FOLD_V'], forward.constexprs['FOLD_H']) == (True, True)
        assert parts.grid == (-(-64 * 128 // parts.constexprs['BLOCK']), 8, 2)
        assert check_kernels.MEMORY_PASSES['_whole_fwd_parts'](parts) == 2 * 8 * 64 * 128 * (4 + 32)
        assert [x.name for x in launches(64, 128, torch.float32)] == ['_whole_fwd']
        parts, forward = launches(50, 84, torch.bfloat16)
        assert (forward.constexprs['FOLD_V'], forward.constexprs['FOLD_H']) == (True, False)
        assert (forward.constexprs['COLS_V'], forward.constexprs['COLS_H']) == (21, 10)
        assert 32 * 64 < whole.FOLD_TOKENS and [x.name for x in launches(32, 64, torch.bfloat16)] == ['_whole_fwd']
    finally:
        whole._FWD_PLANS.clear()
    # 3.35 MB at sm_90's 3.35 TB/s: a microsecond
    assert check_kernels.kernel_model.memory_us(check_kernels.kernel_model.GPUS[90], 3.35e6) == pytest.approx(1.0)


def test_whole_backward_column_chunks_narrower_than_the_spreader(monkeypatch):
    """On other tiles of 16 tokens (sm_90's half-precision tiles at 7 x 7) the backward takes column chunks of 8
    columns over 2 map rows: the column spreader stays 16 wide, its last columns empty. 7 x 7 and 2 x 17 (three
    chunks; its transpose, 17 x 2, one) equal the reference, gradients included."""
    import dataclasses

    from mmppma.ops.whole import triton_impl
    config = lp.config

    def other_tiles_of_16(family, *args, **kwargs):
        chosen = config(family, *args, **kwargs)
        return dataclasses.replace(chosen, block_n=16) if family.startswith('whole_bwd') else chosen

    monkeypatch.setattr(lp, 'config', other_tiles_of_16)
    triton_impl._BWD_PLANS.clear()
    ran = launched(monkeypatch)
    try:
        for shape in ((1, 2, 7, 7, 16), (1, 1, 2, 17, 16, 8)):
            assert_same(partial(ops.ppma_attention, scale=0.25), make(*shape))
        tiles = {(x.constexprs['BLOCK_OTHER'], x.constexprs['COLS_V'], x.constexprs['COLS_H'])
                 for x in ran if x.name == '_whole_bwd'}
        assert tiles == {(16, 8, 8)}, tiles
    finally:
        triton_impl._BWD_PLANS.clear()


def test_whole_backward_keys_on_other_tiles_over_four_rows(monkeypatch):
    """The keys' programs on tiles of 64 others in 16 columns over 4 map rows (800 x 1344's stage 4 on sm_90 under
    triton 3.7 or later, where the two paths then share a launch; 32 others under 3.6) equal the reference, gradients
    included, at 9 x 12 (rows past the image in its last tile)."""
    import dataclasses

    from mmppma.ops import plan
    from mmppma.ops.whole import triton_impl
    config, role_plans = lp.config, triton_impl._role_plans

    def keys_block(cap, shape, version):
        monkeypatch.setattr(lp, 'triton_version', lambda: version)
        triton_impl._BWD_PLANS.clear()
        q = torch.empty(*shape, dtype=torch.bfloat16, device='meta', requires_grad=True)
        la = torch.empty(*shape[:-1], device='meta')
        with lp.recording(cap) as ran:
            torch.autograd.grad(ops.ppma_attention(q, q, q, la, la, scale=0.25, impl='triton'), [q],
                                torch.empty(*shape[:-1], q.shape[-1], device='meta'))
        return [(x.constexprs['KEYS'], x.grid[1], x.constexprs['BLOCK_OTHER']) for x in ran if x.name == '_whole_bwd']

    monkeypatch.setattr(plan, 'triton_interpreted', lambda: True)  # meta tensors take the Triton path
    try:
        assert keys_block(90, (2, 8, 25, 42, 32), (3, 7)) == [(False, 2, 32), (True, 2, 64)]
        assert keys_block(90, (2, 8, 25, 42, 32), (3, 6)) == [(False, 2, 32), (True, 1, 64), (True, 1, 32)]
        monkeypatch.undo()
        # on the interpreter: the keys' tiles of 64 others kept over more rows than two
        monkeypatch.setattr(lp, 'config', lambda family, *args, **kwargs: dataclasses.replace(
            config(family, *args, **kwargs), block_n=64) if family == 'whole_bwd_kv' else config(family, *args,
                                                                                                 **kwargs))
        monkeypatch.setattr(triton_impl, '_role_plans', lambda *args: role_plans(*args[:-1], False))
        triton_impl._BWD_PLANS.clear()
        ran = launched(monkeypatch)
        assert_same(partial(ops.ppma_attention, scale=0.25), make(1, 2, 9, 12, 16))
        tiles = {(x.constexprs['BLOCK_OTHER'], x.constexprs['COLS_V'], x.constexprs['COLS_H'])
                 for x in ran if x.name == '_whole_bwd' and x.constexprs['KEYS']}
        assert (64, 16, 16) in tiles, tiles  # (9 x 12: both maps in tiles of 4 rows, 3 rows past the image's)
    finally:
        triton_impl._BWD_PLANS.clear()


def test_whole_backward_roles_in_one_launch_or_apart(monkeypatch):
    """The queries' and the keys' programs share one launch where both roles take the same tiles (every launch on the
    interpreter; sm_90's bfloat16 tiles at 7 x 7, Manhattan's one path included), else one launch each (800 x 1344's
    stage 3 on sm_90: the keys' programs take 64 others; sm_80's queries on own tiles of 64, a launch per path).
    Apart, the backward equals the reference too (gradients of every input; the forms of one and of two paths)."""
    from mmppma.ops import plan
    from mmppma.ops.whole import triton_impl

    def backward(cap, shape, dtype, manhattan=False):
        b, heads, h, w, d = shape
        q = torch.empty(*shape, dtype=dtype, device='meta', requires_grad=True)
        with lp.recording(cap) as ran:
            if manhattan:
                out = ops.manhattan_attention(q, q, q, torch.empty(heads, device='meta'), scale=0.25, impl='triton')
            else:
                la = torch.empty(b, heads, h, w, device='meta')
                out = ops.ppma_attention(q, q, q, la, la, scale=0.25, impl='triton')
            torch.autograd.grad(out, [q], torch.empty_like(out))
        return [(x.grid[1], x.constexprs['BOTH'], x.constexprs['KEYS']) for x in ran if x.name == '_whole_bwd']
    monkeypatch.setattr(plan, 'triton_interpreted', lambda: True)  # meta tensors take the Triton path
    triton_impl._BWD_PLANS.clear()
    try:
        assert backward(90, (64, 16, 7, 7, 32), torch.bfloat16) == [(4, True, False)]
        assert backward(90, (64, 16, 7, 7, 32), torch.bfloat16, manhattan=True) == [(2, True, False)]
        assert backward(90, (2, 8, 50, 84, 32), torch.bfloat16) == [(2, False, False), (2, False, True)]
        # sm_80, own tiles of 64: the queries' programs take a launch per path (two paths spill), the keys' one
        assert backward(80, (1, 8, 64, 128, 32), torch.bfloat16) == [(1, False, False), (1, False, False),
                                                                      (2, False, True)]
        assert backward(80, (1, 8, 64, 128, 32), torch.bfloat16, manhattan=True) == [(2, True, False)]
        ran = launched(monkeypatch)
        monkeypatch.setattr(triton_impl, 'roles_in_one_launch', lambda plans: plans)
        triton_impl._BWD_PLANS.clear()
        for form in ('release', 'h2v'):
            assert_same(partial(ops.ppma_attention, scale=0.25, form=form), make(1, 2, 5, 6, 16))
        assert {(x.constexprs['BOTH'], x.constexprs['KEYS']) for x in ran if x.name == '_whole_bwd'} == {
            (False, False), (False, True)}
    finally:
        triton_impl._BWD_PLANS.clear()


def test_narrow_tall_image_runs_transposed(monkeypatch):
    """An image narrower than ``lp.NARROW`` and at least that tall: every whole-attention launch sees the
    transpose, 3 rows of 21 tokens (Manhattan's 'v2h' runs as 'h2v' there)."""
    ran = launched(monkeypatch)
    q, k, v, la, lb = make(1, 2, 21, 3, 16)
    assert_same(lambda *a, impl: ops.manhattan_attention(*a, LOG_DECAY[:2], scale=0.25, impl=impl), [q, k, v])
    ops.ppma_attention(q, k, v, la, lb, impl='triton').sum().backward()
    # the image the launches see is 3 x 21 (its map widths: 21, and 3 for its own transpose), forward and backward;
    # a forward's width is 0 for a path it does not run
    widths = {(x.constexprs['HH'], x.constexprs['WW']) for x in ran if x.name in ('_whole_fwd', '_whole_bwd')}
    assert widths <= {(3, 21), (3, 0), (0, 21)} and (3, 21) in widths, widths


def test_extreme_decays_in_kernels_stay_finite():
    q, k, v, la, lb = make(1, 2, 5, 9, 16)
    for op in (ops.ppma_attention, ops.criss_cross_attention):
        out, *grads = out_and_grads(partial(op, impl='triton'), [q, k, v, la - 1e4, lb - 1e4])
        assert torch.isfinite(out).all() and all(torch.isfinite(g_).all() for g_ in grads)


@pytest.mark.parametrize('op', [ops.ppma_attention, ops.criss_cross_attention], ids=['whole', 'criss_cross'])
def test_log_decays_at_the_contract_boundary_equal_the_reference(op):
    """The kernels take a segment's log-decay as minus an absolute difference (exact for log-decays <= 0): at 0
    (ties in every cumulative sum) and mixed with large ones, output and gradients equal the reference's (whose
    gradients follow the segment-sum convention by index order, as the kernels' do)."""
    q, k, v, la, lb = make(1, 2, 5, 9, 16, seed=7)
    zero = torch.zeros_like(la)
    mixed = torch.where(torch.rand(la.shape, generator=torch.Generator().manual_seed(2)) < 0.5, 0.0, -3.0)
    for a, b in ((zero, zero), (mixed.to(DEVICE), zero)):
        assert_same(partial(op, scale=0.25), [q, k, v, a.clone().requires_grad_(), b.clone().requires_grad_()])


def test_shapes_span_several_ragged_blocks():
    """At this device's tiles the shapes above span several blocks of every kernel, the last one ragged."""
    cap = lp.capability(torch.device(DEVICE))
    for family in ('whole_fwd', 'whole_bwd_q', 'whole_bwd_kv'):
        assert any(h * w > 2 * c.block_m and h * w % c.block_m and h * w % c.block_n and w > max(c.block_m, c.block_n)
                   for *_, h, w, _, _ in WHOLE_SHAPES for c in [lp.config(family, h * w, torch.float32, cap, w)])
    for family in ('line_fwd', 'line_bwd'):
        for axis in (-4, -3):  # column length H, row length W
            assert any(s[axis] > max(c.block_m, c.block_n) and s[axis] % c.block_m and s[axis] % c.block_n
                       for s in LINE_SHAPES for c in [lp.config(family, s[axis], torch.float32, cap)]), family
    blocks = {length: lp.config('scan', length, torch.float32, cap).block_m for length in SCAN_LENGTHS}
    assert any(length == block for length, block in blocks.items())
    assert any(length > 2 * block and length % block for length, block in blocks.items())


def test_line_forward_with_a_given_log_normaliser_equals_its_own():
    """A line pass given the log-normaliser of a pass over the same scores (criss-cross 'release' form's last row
    pass) computes the final probabilities directly: its output equals the pass that computes its own, on rows of
    several blocks, the last ragged; the given lse is returned as is, and a malformed one is refused."""
    from mmppma.ops.line import triton_impl as line
    cap = lp.capability(torch.device(DEVICE))
    q, k, x, la, _ = (t.detach() for t in make(1, 1, 2, 37, 16, 8, seed=4))
    c = la.float().contiguous()
    launches, want, lse = line.forward_launches(q, k, x, c, 0.25, False, cap)
    lp.run(launches)
    launches, got, same = line.forward_launches(q, k, 2 * x, c, 0.25, False, cap, lse=lse)
    assert [launch.constexprs['LSE_GIVEN'] for launch in launches] == [True]
    lp.run(launches)
    assert same is lse
    torch.testing.assert_close(got, 2 * want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match='contiguous float32 tensor of shape'):
        line.forward_launches(q, k, x, c, 0.25, False, cap, lse=lse.double())


@pytest.mark.parametrize('length', [pytest.param(100, marks=pytest.mark.heavy), 150])
def test_line_kernels_at_sm90_tiles_in_bfloat16_against_float64(length):
    """The line kernels with sm_90's bfloat16 tiles (64 x 64 on 100 tokens, 32 x 32 on 150): rows of several
    blocks, the last ragged, so that every part runs (keys before the own block, in it, after it, the last block
    read masked apart from the loop) in half precision, where the table gradient's row sums go through the tensor
    cores: the forward, the forward given its own log-normaliser, and the backward against float64 on the same
    rounded inputs; and the passes that take the other tokens' terms in their products from the tables' parts
    (written by a pass along the line with another table beside it: the row table's parts in columns 0-2, the
    column table's in 3-5, the pass's lse in 6-8 along rows, 9-11 along columns), along rows and along
    columns."""
    from mmppma.ops.line import triton_impl as line
    cfg = lp.config('line_bwd', length, torch.bfloat16, 90)
    assert length > cfg.block_n and line.ragged(length, cfg.block_n)
    g = torch.Generator().manual_seed(length)
    q, k, x = (torch.randn(1, 1, 1, length, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    c = (-0.3 * torch.rand(1, 1, 1, length, generator=g)).cumsum(-1)
    dout = torch.randn(1, 1, 1, length, 16, generator=g).to(torch.bfloat16)
    wide = [t.double().requires_grad_() for t in (q, k, x, c)]
    qd, kd, xd, cd = (t[:, :, 0] for t in wide)
    bias = -(cd[..., :, None] - cd[..., None, :]).abs()
    want = ((qd @ kd.transpose(-1, -2)) * 0.25 + bias).softmax(-1) @ xd
    want_grads = torch.autograd.grad(want, wide, dout[:, :, 0].double())
    launches, out, lse = line.forward_launches(q, k, x, c, 0.25, False, 90)
    lp.run(launches)
    launches, given, _ = line.forward_launches(q, k, x, c, 0.25, False, 90, lse=lse)
    lp.run(launches)
    launches, grads = line.backward_launches(q, k, x, c, out, lse, dout, 0.25, False, 90)
    assert [launch.constexprs['BOTH'] for launch in launches] == [True]  # equal blocks: both roles in one
    lp.run(launches)
    checks = [('out', out, want), ('out given lse', given, want),
              *zip(('dq', 'dk', 'dx', 'dc'), grads, want_grads)]
    # the kernel's roles in launches apart (as unequal blocks run them): the keys' store the table's part, the
    # queries' add theirs
    launches, apart = line.backward_launches(q, k, x, c, out, lse, dout, 0.25, False, 90)
    (both, ) = launches
    lp.run([dataclasses.replace(both, constexprs=dict(both.constexprs, BOTH=False, KEYS=keys, ACC_GC=not keys))
            for keys in (True, False)])
    checks += [(f'roles apart: {name}', got, ref) for name, got, ref in zip(('dq', 'dk', 'dx', 'dc'), apart,
                                                                             want_grads)]
    for columns in (False, True):
        def line_of(t):  # the row's tensors as one column
            return t.transpose(2, 3).contiguous() if columns else t
        qc, kc, xc, cc, dc = (line_of(t) for t in (q, k, x, c, dout))
        assert line.folds(qc, (columns, ), 90)  # 64-query blocks on 100 tokens, 32 at head dim 16 on 150
        parts = line.table_parts_buffer(qc)
        launches, written, lse = line.forward_launches(qc, kc, xc, cc, 0.25, columns, 90, parts=parts,
                                                       other_table=torch.full_like(cc, -7.0))
        assert [(x.constexprs['WRITE_TABLES'], x.constexprs['FOLD']) for x in launches] == [(True, False)]
        lp.run(launches)
        launches, fold, _ = line.forward_launches(qc, kc, xc, cc, 0.25, columns, 90, parts=parts)
        assert [(x.constexprs['WRITE_LSE'], x.constexprs['FOLD']) for x in launches] == [(True, True)]
        lp.run(launches)
        launches, fold_given, _ = line.forward_launches(qc, kc, xc, cc, 0.25, columns, 90, lse=lse, parts=parts)
        assert [(x.constexprs['WRITE_LSE'], x.constexprs['FOLD']) for x in launches] == [(False, True)]
        lp.run(launches)
        # each table's and pass's three parts: the row table, the column table, the row pass's lse, the column's
        total = parts.float().reshape(-1, 16)[:, :12].reshape(-1, 4, 3).sum(-1) * 0.25
        torch.testing.assert_close(total[:, 1 if columns else 0], cc.reshape(-1), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(total[:, 0 if columns else 1], torch.full_like(total[:, 0], -7.0))
        torch.testing.assert_close(total[:, 3 if columns else 2], lse.reshape(-1), rtol=1e-6, atol=1e-5)
        assert not parts.reshape(-1, 16)[:, 12:].any()
        launches, folded_grads = line.backward_launches(qc, kc, xc, cc, written, lse, dc, 0.25, columns, 90,
                                                        parts=parts)
        assert [(x.constexprs['FOLD'], x.constexprs['BOTH']) for x in launches] == [(True, True)]  # both roles
        lp.run(launches)
        direction = 'columns' if columns else 'rows'
        checks += [(f'{direction}: {name}', got.transpose(2, 3) if columns else got, ref)
                   for name, got, ref in (('writing the parts', written, want), ('folded', fold, want),
                                          ('folded, given lse', fold_given, want),
                                          *((f'folded {n}', g, r) for n, g, r in zip(('dq', 'dk', 'dx', 'dc'),
                                                                                      folded_grads, want_grads)))]
    for name, got, ref in checks:
        error = ((got.double().reshape(ref.shape) - ref).norm() / ref.norm()).item()
        assert error < 1e-2, f'{name}: relative error {error:.1e}'


@pytest.mark.parametrize('cap, d, dtype, backward, flags', [
    (90, 32, torch.bfloat16, False, [(True, False, False), (False, True, True), (False, False, True)]),
    (80, 32, torch.bfloat16, False, [(True, False, False), (False, True, True), (False, False, True)]),
    (86, 16, torch.bfloat16, False, [(True, False, False), (False, True, True), (False, False, True)]),
    (86, 32, torch.bfloat16, False, [(False, False, False)] * 3),
    (86, 32, torch.bfloat16, True, [(True, False, False), (False, True, False), (False, False, False)]),
    (90, 32, torch.float32, True, [(False, False, False)] * 3)])
def test_criss_cross_writes_the_tables_parts_where_a_pass_takes_them(monkeypatch, cap, d, dtype, backward, flags):
    """Form 'release' on 100 x 100 (lines of several blocks): per pass (WRITE_TABLES, WRITE_LSE, FOLD). Where a
    later forward takes its table in its products (64-query blocks, as on sm_90 and sm_80; sm_86's 32-query blocks
    at head dim 16) the first pass writes both tables' parts and the second its lse's; on 32-query blocks at head
    dim 32 the forwards keep the addition, and the parts are written only for a backward to read (autograd);
    float32 takes none."""
    from mmppma.ops.criss_cross import triton_impl as criss_cross
    ran = []
    monkeypatch.setattr(lp, 'run', ran.extend)
    monkeypatch.setattr(lp, 'capability', lambda device: cap)
    q = torch.empty(1, 2, 100, 100, d, dtype=dtype, device='meta')
    tables = torch.empty(1, 2, 100, 100, device='meta')
    out = criss_cross._forward(q, q, q, tables, tables, 0.25, 'release', backward)
    assert [(x.constexprs['WRITE_TABLES'], x.constexprs['WRITE_LSE'], x.constexprs['FOLD']) for x in ran] == flags
    assert (out[-1] is None) == (not flags[0][0])


@pytest.mark.parametrize('cap, write_lse, registers', [(90, False, [168, 255, 168]), (80, True, [255] * 3)])
def test_a_pass_writes_its_lse_parts_where_its_backward_reads_them(monkeypatch, cap, write_lse, registers):
    """Form 'release' on 50 x 100 (bfloat16, head dim 32, under autograd): the column pass (lines of 50, 64 value
    channels) writes its lse's parts only where its backward takes them in its products: not on sm_90, whose
    backward holds such a line in one block, but on sm_80 (two blocks of 32). On sm_90 the forwards hold 168
    registers per thread (12 warps per SM), but the column pass, on lines shorter than its block, 255."""
    from mmppma.ops.criss_cross import triton_impl as criss_cross
    ran = []
    monkeypatch.setattr(lp, 'run', ran.extend)
    monkeypatch.setattr(lp, 'capability', lambda device: cap)
    q = torch.empty(1, 2, 50, 100, 32, dtype=torch.bfloat16, device='meta')
    tables = torch.empty(1, 2, 50, 100, device='meta')
    criss_cross._forward(q, q, q, tables, tables, 0.25, 'release', True)
    assert [x.constexprs['WRITE_LSE'] for x in ran] == [False, write_lse, False]
    assert [x.config.maxnreg for x in ran] == registers


@pytest.mark.parametrize('columns', [False, True])
def test_line_backward_on_lines_of_one_block_against_float64(columns):
    """Lines of one block whose roles would take two launches (sm_90, bfloat16, 28 tokens in 32, head dim 32): one
    launch computes both roles from one tile of scores (ONE_BLOCK), the padded tokens contributing nothing; the
    gradients it adds to buffers an earlier pass filled (dq, dk, the table's) against float64."""
    from mmppma.ops.line import triton_impl as line
    g = torch.Generator().manual_seed(28)
    shape = (1, 2, 28, 3, 32) if columns else (1, 2, 3, 28, 32)
    q, k, x, dout = (torch.randn(*shape, generator=g).to(torch.bfloat16) for _ in range(4))
    c = (-0.3 * torch.rand(*shape[:-1], generator=g)).cumsum(2 if columns else 3)
    wide = [t.double().requires_grad_() for t in (q, k, x, c)]
    qd, kd, xd, cd = (t.transpose(2, 3) if columns else t for t in wide)
    bias = -(cd[..., :, None] - cd[..., None, :]).abs()
    want = ((qd @ kd.transpose(-1, -2)) * 0.25 + bias).softmax(-1) @ xd
    want = want.transpose(2, 3) if columns else want
    want_grads = torch.autograd.grad(want, wide, dout.double())
    launches, out, lse = line.forward_launches(q, k, x, c, 0.25, columns, 90)
    lp.run(launches)
    earlier = [torch.randn(t.shape, generator=g) for t in (q, k, c)]
    launches, grads = line.backward_launches(q, k, x, c, out, lse, dout, 0.25, columns, 90,
                                             *(t.clone() for t in earlier))
    assert [(x.constexprs['ONE_BLOCK'], x.constexprs['BOTH']) for x in launches] == [(True, False)]
    lp.run(launches)
    dq, dk, dx, dc = grads
    for name, got, ref in (('dq', dq - earlier[0], want_grads[0]), ('dk', dk - earlier[1], want_grads[1]),
                           ('dx', dx, want_grads[2]), ('dc', dc - earlier[2], want_grads[3])):
        error = ((got.double() - ref).norm() / ref.norm()).item()
        assert error < 1e-2, f'{name}: relative error {error:.1e}'


@pytest.mark.parametrize('d, dx, keys_fold, both', [(16, 32, True, True), (32, 64, False, False)])
def test_line_backward_folds_but_where_the_keys_programs_registers_are_full(d, dx, keys_fold, both):
    """sm_80's backward on columns of 56 tokens (32 x 32 tiles) given the parts: the queries' role takes the other
    tokens' terms in its products, and so does the keys' but at head dim 32 with 64 value channels; both roles
    share a launch where their own-token sums are small (head dim 16)."""
    from mmppma.ops.line import triton_impl as line
    q = torch.empty(1, 2, 56, 3, d, dtype=torch.bfloat16, device='meta')
    x = torch.empty(1, 2, 56, 3, dx, dtype=torch.bfloat16, device='meta')
    c = torch.empty(1, 2, 56, 3, device='meta')
    launches, _ = line.backward_launches(q, q, x, c, x.float(), c, x, 0.25, True, 80,
                                         parts=line.table_parts_buffer(q))
    flags = [x.constexprs for x in launches]
    assert [(f['BOTH'], f['KEYS'], f['BLOCK_OWN'], f['FOLD']) for f in flags] == (
        [(True, False, 32, True)] if both else [(False, True, 32, True), (False, False, 32, True)])
    assert [f['FOLD'] and not line.keys_full(f['BLOCK_OWN'], f['BLOCK_D'], f['BLOCK_X'])
            for f in flags if f['KEYS'] or f['BOTH']] == [keys_fold]


def test_whole_kernel_backward_extra_memory_is_linear_in_n():
    """The table gradient is reduced onto the H x W tables in-kernel, not through an N x W or N x H segment table."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestFloatTensor(TorchDispatchMode):
        largest = (0, None)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > self.largest[0]:
                    self.largest = (t.numel(), str(func))
            return out

    leaves = make(1, 1, 14, 16, 2, seed=4)
    out = ops.ppma_attention(*leaves, impl='triton')
    with LargestFloatTensor() as mode:
        torch.autograd.grad(out, leaves, torch.ones_like(out))
    # the table gradients: (2 + 2 corner slots per path) x 2 tables x N (own tiles of 32 tokens touch a row of 14 or
    # 16 at most twice); an N x H or N x W segment table would be 14 N or 16 N
    assert mode.largest[0] <= 12 * 224, f'backward allocated {mode.largest[0]} floats ({mode.largest[1]})'


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_half_precision_kernels_close_to_float32(dtype):
    """Half q, k, v against float32 on the same rounded values: output (half) and gradients within 1e-2."""
    whole = make(1, 2, 5, 7, 16, seed=5)
    for op, xs, half in ((partial(ops.ppma_attention, scale=0.25), whole, {0, 1, 2}),
                             (partial(ops.criss_cross_attention, scale=0.25), whole, {0, 1, 2}),
                             (lambda *a, impl: ops.manhattan_attention(*a, LOG_DECAY[:2], scale=0.25, impl=impl),
                              whole[:3], {0, 1, 2}), (partial(ops.polyline_mask_matvec, form='2d'), whole[2:], {0})):
        rounded = [t.detach().to(dtype).float() if i in half else t.detach() for i, t in enumerate(xs)]
        want = out_and_grads(partial(op, impl='reference'), [t.requires_grad_() for t in rounded])
        got = out_and_grads(partial(op, impl='triton'), [(t.detach().to(dtype) if i in half else t.detach())
                                                         .requires_grad_() for i, t in enumerate(rounded)])
        assert got[0].dtype == dtype
        for i, (a, b) in enumerate(zip(got, want)):
            err = ((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()
            assert torch.isfinite(a).all() and err < 1e-2, f'tensor {i}: relative error {err:.2e} in {dtype}'


def test_cpu_tensors_without_the_interpreter_name_the_alternatives(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    with pytest.raises(RuntimeError, match="impl='torch'"):
        ops.ppma_attention(*(t.detach().cpu() for t in make(1, 1, 2, 2, 4)), impl='triton')


@triton.jit
def _offset_probe(out_ptr, index, n, d):
    tl.store(out_ptr, slice_offset(index, n, d))


def test_slice_offsets_are_int64():
    out = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    _offset_probe[(1, )](out, 70000, 8192, 64)  # 3.7e10 > 2**31; each factor an int32 argument
    assert out.item() == 70000 * 8192 * 64
