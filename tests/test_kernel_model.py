"""tools/kernel_model.py: occupancy, the tiles a launch computes, waves, the tensor-core shapes read from SASS and the
fit against a GPU run, each against a count made independently (by hand, or by walking the kernels' loops)."""
import itertools

import pytest

from .conftest import load_tool

model = load_tool('kernel_model.py')
sass_cost = load_tool('sass_cost.py')
H100 = model.GPUS[90]


def test_occupancy_follows_registers_warps_and_shared_memory():
    # 255 registers round up to 256 per thread: 8192 per warp, 2 programs of 4 warps in 64K
    assert model.occupancy(H100, 255, 20 * 1024, 4) == (2, 'registers')
    # 91 -> 96 per thread: 3072 per warp, 24576 per 8-warp program: 2 fit
    assert model.occupancy(H100, 91, 20 * 1024, 8) == (2, 'registers')
    # 32 registers, 4 warps: 16 programs by warps (64 / 4) and by registers (65536 / 4096)
    assert model.occupancy(H100, 32, 1024, 4)[0] == 16
    # shared memory: 100 KB programs, 1 KB reserved each: 2 in 228 KB
    assert model.occupancy(H100, 32, 100 * 1024, 4) == (2, 'shared')


def _walk_whole_fwd(h, w, own, other, cols):
    """Computed and real scores of whole attention's forward V2H path on an h x w map, by walking its loops: one
    program per (map row, own tile of columns), a column-chunk loop and a row loop inside."""
    computed = real = 0
    rows_per_tile = other // cols
    for row, start in itertools.product(range(h), range(0, w, own)):
        queries = [c for c in range(start, start + own) if c < w]
        for c0 in range(0, w, cols):
            for r0 in range(0, h, rows_per_tile):
                keys = [(r, c) for r in range(r0, r0 + rows_per_tile) for c in range(c0, c0 + cols)]
                computed += own * other
                real += len(queries) * sum(r < h and c < w for r, c in keys)
    return computed, real


@pytest.mark.parametrize('h, w, own, other, cols', [(5, 7, 4, 8, 4), (7, 13, 8, 16, 8), (3, 16, 16, 16, 16),
                                                     (8, 13, 8, 16, 5)])
def test_whole_forward_tiles_match_a_walk_of_its_loops(h, w, own, other, cols):
    desc = dict(kernel='_whole_fwd', constexprs=dict(V2H=True, H2V=False, BLOCK_V=own, BLOCK_H=16, COLS_V=cols,
                                                     COLS_H=8, BLOCK_N=other))
    [(path, (programs, iterations, o, t))] = model.tiles(desc, h, w, 3)
    computed, real = _walk_whole_fwd(h, w, own, other, cols)
    assert path == 'v2h' and programs * iterations * o * t == 3 * computed
    assert model.real_scores(desc, h, w, 3) == 3 * real
    # the H2V path runs on the transpose: the same walk with h and w swapped
    [(path, tile)] = model.tiles(dict(desc, constexprs=dict(desc['constexprs'], V2H=False, H2V=True, BLOCK_H=own,
                                                            COLS_H=cols)), h, w, 1)
    assert path == 'h2v' and tile[0] * tile[1] * tile[2] * tile[3] == _walk_whole_fwd(w, h, own, other, cols)[0]


@pytest.mark.parametrize('h, w, own, other, cols', [(50, 84, 64, 64, 21), (7, 20, 16, 32, 5), (9, 16, 16, 32, 16)])
def test_whole_forward_key_tiles_from_the_query_tile_row(h, w, own, other, cols):
    """Key tiles that are not full, against query tiles of consecutive tokens over two map rows at most, start one
    row below each query tile's first (``_fwd_map``'s SHIFTED bounds, walked here tile by tile): every key of the
    map is visited once per query tile, each key tile lies on or above every query row or on or below them, and the
    computed scores are the model's. 800 x 1344's stage 3 V2H path (tiles of 3 x 21: one place empty, rows past the
    map): 94% real."""
    from mmppma.ops.whole.triton_impl import shifted_key_tiles
    assert shifted_key_tiles(h, w, cols, other, own)
    key_rows, queries = other // cols, -(-h * w // own)
    computed = real = 0
    for tile in range(queries):
        tokens = [t for t in range(tile * own, tile * own + own) if t < h * w]
        first, last = tokens[0] // w, tokens[-1] // w
        above = first + 1
        starts = list(range(above - -(-above // key_rows) * key_rows, above, key_rows))
        starts += list(range(above, above + -(-(h - above) // key_rows) * key_rows, key_rows))
        seen = []
        for c0, r0 in itertools.product(range(0, w, cols), starts):
            assert r0 + key_rows - 1 <= first or r0 >= last
            keys = [(r0 + place // cols, c0 + place % cols) for place in range(key_rows * cols)]
            seen += [(r, c) for r, c in keys if 0 <= r < h and c < w]
            computed += own * other
        assert sorted(seen) == list(itertools.product(range(h), range(w)))
        real += len(tokens) * len(seen)
    desc = dict(kernel='_whole_fwd', constexprs=dict(V2H=True, H2V=False, BLOCK_M=own, COLS_V=cols, COLS_H=8,
                                                     BLOCK_N=other, SCORES_LAYOUT=True))
    [(path, (programs, iterations, o, t))] = model.tiles(desc, h, w, 2)
    assert programs * iterations * o * t == pytest.approx(2 * computed)
    assert model.real_scores(desc, h, w, 2) == 2 * real
    if (h, w) == (50, 84):
        assert real / computed == pytest.approx(0.94, abs=0.005)


@pytest.mark.parametrize('rows, cols, own, key_rows, share', [(64, 32, 64, 2, 1 / 32), (32, 64, 64, 1, 0.0),
                                                               (14, 14, 64, 4, None), (7, 7, 64, 8, None)])
def test_between_share_counts_the_forward_key_loop_between_the_query_rows(rows, cols, own, key_rows, share):
    """The share of key-tile iterations between a query tile's rows, against the forward's own bounds per query
    tile (whole attention's ``_fwd_map``: key tiles before ``above`` lie on or above the tile's first row, from
    ``below`` on or below its last). Cityscapes' stage 4 H2V path (64 x 32, query tiles of two rows, key tiles of
    two): one key tile in 32; row-aligned query tiles: none."""
    tiles, between = -(-rows * cols // own), 0
    for tile in range(tiles):
        first, last = tile * own // cols, (min(tile * own + own, rows * cols) - 1) // cols
        above = (first + 1) // key_rows * key_rows
        below = max(-(-last // key_rows) * key_rows, above)
        between += (min(below, -(-rows // key_rows) * key_rows) - above) // key_rows
    got = model.between_share(rows, cols, own, key_rows)
    assert got == pytest.approx(between / (tiles * -(-rows // key_rows)))
    if share is not None:
        assert got == pytest.approx(share)


@pytest.mark.parametrize('rows, cols, own, key_rows, share', [(64, 128, 64, 1, 1 / 64), (50, 84, 64, 1, None),
                                                               (25, 42, 64, 2, None), (7, 7, 64, 2, 1.0)])
def test_own_rows_share_counts_the_backward_queries_loop_on_their_rows(rows, cols, own, key_rows, share):
    """The share of other-tile iterations that hold one of the own tile's map rows, against the backward queries'
    own bounds per own tile (whole attention's ``_bwd_map``: the tiles from ``own_from`` to ``own_to`` run the
    corners' loop). Cityscapes' stage 3 (own tiles of one row of 128, tiles of one row): one tile in 64; a 7 x 7
    map in one own tile: every tile."""
    tiles, on_rows = -(-rows * cols // own), 0
    for tile in range(tiles):
        first, last = tile * own // cols, (min(tile * own + own, rows * cols) - 1) // cols
        own_from, own_to = first // key_rows * key_rows, last // key_rows * key_rows + key_rows
        on_rows += (own_to - own_from) // key_rows
    got = model.own_rows_share(rows, cols, own, key_rows)
    assert got == pytest.approx(on_rows / (tiles * -(-rows // key_rows)))
    if share is not None:
        assert got == pytest.approx(share)


@pytest.mark.parametrize('h, w, own, other, cols', [(5, 7, 16, 8, 4), (7, 13, 32, 16, 8), (25, 42, 64, 32, 16)])
def test_whole_backward_own_tiles_of_consecutive_tokens(h, w, own, other, cols):
    """The backward's own tiles of BLOCK_OWN consecutive map tokens (only the map's last tile pads) against the keys'
    column-chunked tiles: the queries on the forward's map, the keys on its transpose; counted by a walk."""
    def walk(h, w):
        tiles = -(-h * w // own)
        chunks, row_tiles = -(-w // cols), -(-h // (other // cols))
        return tiles * chunks * row_tiles * own * other
    base = dict(V2H=True, H2V=False, BLOCK_OWN=own, COLS_V=cols, COLS_H=cols, BLOCK_OTHER=other)
    for keys, (rows, columns) in ((False, (h, w)), (True, (w, h))):
        desc = dict(kernel='_whole_bwd', constexprs=dict(base, KEYS=keys))
        [(path, (programs, iterations, o, t))] = model.tiles(desc, h, w, 2)
        assert path == 'v2h' and programs * iterations * o * t == 2 * walk(rows, columns)
        assert programs == 2 * -(-h * w // own)
    # a launch of both roles: the queries' part, then the keys', each as its launch apart
    both = model.tiles(dict(kernel='_whole_bwd', constexprs=dict(base, KEYS=False, BOTH=True)), h, w, 2)
    apart = [model.tiles(dict(kernel='_whole_bwd', constexprs=dict(base, KEYS=keys)), h, w, 2)[0][1]
             for keys in (False, True)]
    assert both == [('v2h', apart[0]), ('v2h keys', apart[1])]


def test_keys_of_consecutive_tokens_and_lines():
    """Without column chunks the keys come in blocks of consecutive tokens; a line kernel pads each line."""
    desc = dict(kernel='_whole_fwd', constexprs=dict(V2H=True, H2V=False, BLOCK_V=32, BLOCK_H=64, BLOCK_N=64))
    assert model.tiles(desc, 50, 84, 16) == [('v2h', (16 * 50 * 3, 66, 32, 64))]  # 4200 tokens: 66 blocks
    line = dict(kernel='_line_fwd', constexprs=dict(COLUMNS=True, BLOCK_M=32, BLOCK_N=64))
    assert model.tiles(line, 50, 84, 2) == [('lines', (2 * 84 * 2, 1, 32, 64))]
    assert model.real_scores(line, 50, 84, 2) == 2 * 84 * 50 * 50


def test_tensor_core_instructions_by_shape():
    text = ('        /*0a10*/   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4].tnspB, R24, gsb0 ;  /* 0x0 */\n'
            '        /*0a20*/   HMMA.16816.F32.BF16 R4, R8, R12, RZ ;  /* 0x0 */\n'
            '        /*0a30*/   HMMA.1688.F32.TF32 R4, R8, R12, RZ ;  /* 0x0 */\n'
            '        /*0a40*/   FFMA R4, R4, R5, R6 ;  /* 0x0 */\n')
    shapes = [sass_cost.tensor_fmas(op, m) for (_, op, _), m in zip(sass_cost.parse(text), sass_cost.modifiers(text))]
    assert shapes == [64 * 64 * 16 / 4, 16 * 8 * 16, 16 * 8 * 8, 0.0]


def test_waves_and_the_issue_bound():
    """One program past full waves costs a last wave of one program per SM; issue-bound cycles are the warp
    instructions over four schedulers at the share the resident warps fill."""
    loop = dict(fp32=10, mufu=1, conv=0, int=5, mem=2, other=2, mma=4, tensor=0)  # 24 per warp per iteration
    resident = model.occupancy(H100, 128, 16 * 1024, 4)[0]  # 4 programs (registers)
    full = model.launch_cost(H100, loop, 'bf16', 4, 128, 16 * 1024, (resident * H100.sms, 10, 64, 64), 0.0, 1.0)
    more = model.launch_cost(H100, loop, 'bf16', 4, 128, 16 * 1024, (resident * H100.sms + 1, 10, 64, 64), 0.0, 1.0)
    wave = resident * 24 * 4 * 10 / (4 * model.issue_efficiency(H100, resident * 4))
    assert full.bound == 'issue' and full.cycles == pytest.approx(wave) and full.waves == 1
    one = 24 * 4 * 10 / (4 * model.issue_efficiency(H100, 4))
    assert more.cycles == pytest.approx(wave + one)
    assert model.issue_efficiency(H100, 4) == pytest.approx(H100.issue_share / 2)  # 1 warp per scheduler of 2
    # a MUFU-heavy loop is bound by its pipe (16 lanes per clock per SM)
    heavy = dict(loop, mufu=40)
    cost = model.launch_cost(H100, heavy, 'bf16', 4, 128, 16 * 1024, (resident * H100.sms, 10, 64, 64), 0.0, 1.0)
    assert cost.bound == 'mufu' and cost.cycles == pytest.approx(resident * 40 * 4 * 10 / 0.5)


def test_the_parts_of_a_launch_fill_waves_together():
    """Two parts of one grid (whole attention's paths) of one program per SM each: together two programs per SM,
    8 warps, at the saturated issue share; priced apart each would be a last wave of one program at half of it.
    Their computed and real scores add up."""
    light = dict(fp32=10, mufu=1, conv=0, int=5, mem=2, other=2, mma=4, tensor=0)  # 24 per warp per iteration
    heavy = dict(light, fp32=34)  # 48
    one = H100.sms
    cost = model.parts_cost(H100, [(light, (one, 10, 64, 64), 0.0, 1.0), (heavy, (one, 10, 64, 64), 0.0, 2.0)],
                            'bf16', 4, 128, 16 * 1024)
    assert model.issue_efficiency(H100, 8) == pytest.approx(H100.issue_share)
    assert cost.cycles == pytest.approx(2 * (24 + 48) / 2 * 4 * 10 / (4 * H100.issue_share))
    assert cost.computed == 2 * one * 10 * 64 * 64 and cost.real == 3.0 and cost.iterations == 10
    apart = [model.launch_cost(H100, loop, 'bf16', 4, 128, 16 * 1024, (one, 10, 64, 64), 0.0, 1.0).cycles
             for loop in (light, heavy)]
    assert sum(apart) == pytest.approx(2 * cost.cycles)


def test_the_fit_recovers_a_known_share_and_overhead():
    """Rows made with a known issue share and SDPA overhead give them back, and an op predicted as its kernels
    plus its host ratio times that overhead."""
    share, overhead = 0.5, 0.08
    rows = []
    for (label, kind), measured in model.H200_RUN.items():
        for phase, flash_us in (('fwd', 100.0 if 'stage3' in label else 20.0), ('bwd', 50.0)):
            rows.append(dict(arch=90, dtype='bf16', label=label, kind=kind, phase=phase, ours=3 * flash_us,
                             flash=flash_us))
    # measured SDPA forward consistent with the share and overhead (the rows are priced at share 1)
    run = {key: (m[0], m[1], (100.0 if 'stage3' in key[0] else 20.0) / share / 1e3 + overhead, m[3])
           for key, m in model.H200_RUN.items()}
    fit, out = model.validate(rows, 1.0, run)
    assert fit['fwd']['issue_share'] == pytest.approx(share) and fit['fwd']['overhead_ms'] == pytest.approx(overhead)
    whole = next(row for row in out if row['kind'] == 'whole' and 'stage3' in row['label'] and row['phase'] == 'fwd')
    assert whole['ours'] == pytest.approx(0.3 / share + model.HOST_RATIOS['whole'][0] * overhead)
