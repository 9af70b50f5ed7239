"""PPMLA's and PPMDA's chunked form (mmppma/ops/linear/chunked.py) against the float64 loop oracle (output and the
gradients of q, k, v, both log-decays and the normalizer's features; every form, 1 x N, N x 1 and odd maps, chunks
that do not divide the map, ties and extreme decays), and its counts against the operations the form runs, a hand
count and the budget of linear cost."""
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmppma.ops.linear import chunked as ck
from mmppma.ops.linear import reference

from .oracle import inputs, masked_linear, out_and_grads

DECAYS = {
    'random': lambda la: la,
    'zero': lambda la: torch.zeros_like(la),  # ties in every cumulative sum
    'extreme': lambda la: torch.where(la < -0.5, -30.0, 0.0).to(la.dtype),
}
# (form, (B, heads, H, W), rows, normalizer, decays); normalizer: 'none' (PPMDA), 'self' (elu features,
# normalized), 'separate' (elu, a normalizer of its own), 'identity' (no feature map, positive features, a separate
# normalizer: as MLLA calls it). Maps wider than tall run transposed: their rows count along the long side.
CASES = [
    ('v2h', (1, 1, 7, 7), 2, 'none', 'random'),
    ('h2v', (1, 1, 7, 7), 3, 'self', 'random'),
    ('2d', (1, 2, 7, 7), 4, 'separate', 'random'),
    ('2d', (1, 1, 5, 9), 2, 'self', 'random'),
    ('v2h', (1, 1, 9, 5), 4, 'separate', 'random'),
    ('h2v', (1, 1, 5, 9), 1, 'none', 'random'),
    ('v2h', (1, 1, 5, 9), 4, 'self', 'random'),
    ('2d', (1, 1, 1, 12), 5, 'self', 'random'),
    ('v2h', (1, 1, 12, 1), 5, 'none', 'random'),
    ('h2v', (1, 1, 12, 1), 1, 'separate', 'random'),
    ('2d', (1, 1, 6, 4), 6, 'none', 'random'),
    ('v2h', (1, 1, 4, 6), 10, 'self', 'random'),
    ('2d', (1, 1, 6, 5), 2, 'self', 'zero'),
    ('h2v', (1, 1, 5, 6), 2, 'none', 'zero'),
    ('2d', (2, 1, 6, 5), 1, 'separate', 'extreme'),
    ('v2h', (1, 1, 7, 6), 3, 'identity', 'extreme'),
    ('h2v', (1, 1, 8, 3), 3, 'identity', 'random'),
]


def _leaves(shape, normalizer, decays, seed, dtype=torch.float64, dv=3):
    q, k, v, la, lb = inputs(*shape, 4, seed, dtype, dv)
    la, lb = DECAYS[decays](la), DECAYS[decays](lb)
    extra = list(inputs(*shape, 4, seed + 7, dtype)[:2]) if normalizer in ('separate', 'identity') else []
    if normalizer == 'identity':
        q, k, *extra = (t.abs() for t in (q, k, *extra))
    return [t.requires_grad_() for t in (q, k, v, la, lb, *extra)]


def _chunked(form, rows, normalizer):
    """The op on the chunked core, as reference.decomposed and reference.linear take a core."""
    core = functools.partial(ck.chunked, form=form, rows=rows)
    if normalizer == 'none':
        return functools.partial(reference.decomposed, core)
    feature = reference.FEATURE_MAPS['identity' if normalizer == 'identity' else 'elu']
    return functools.partial(reference.linear, core, feature, True, 1e-6)


@pytest.mark.parametrize('form, shape, rows, normalizer, decays', CASES, ids=lambda x: str(x))
def test_chunked_equals_the_float64_oracle(form, shape, rows, normalizer, decays):
    leaves = _leaves(shape, normalizer, decays, seed=sum(shape) + rows)
    got = out_and_grads(_chunked(form, rows, normalizer), leaves)
    want = out_and_grads(lambda *t: masked_linear(*t, form=form, normalize=normalizer != 'none',
                                                  feature='identity' if normalizer in ('none', 'identity') else 'elu'),
                         leaves)
    for name, a, b in zip(['out', 'q', 'k', 'v', 'la', 'lb', "q'", "k'"], got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12 * max(1.0, b.abs().max().item()), msg=name)


def test_the_chosen_chunk_chunks_and_equals_the_oracle():
    """rows=None: the rows chunk_rows chooses (fewer than the map's, so the states run), output and gradients."""
    shape = (1, 1, 12, 5)
    assert ck.chunk_rows(12, 5, 4, 3, '2d') < 12
    leaves = _leaves(shape, 'separate', 'random', seed=3)
    got = out_and_grads(_chunked('2d', None, 'separate'), leaves)
    want = out_and_grads(lambda *t: masked_linear(*t, form='2d', feature='elu', normalize=True), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12 * max(1.0, b.abs().max().item()))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
def test_extreme_decays_in_low_precision_stay_finite(dtype):
    """Decays of -30 and 0 on a 10 x 7 map in chunks of 3 rows: finite, and as float64 within float32's error
    (half inputs run in float32: the cores take the table dtype)."""
    leaves = _leaves((1, 1, 10, 7), 'separate', 'extreme', seed=1)
    low = [t.detach().to(dtype).requires_grad_() for t in leaves]
    got = out_and_grads(_chunked('2d', 3, 'separate'), low)
    want = out_and_grads(_chunked('2d', 3, 'separate'), leaves)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        tol = 1e-3 if dtype == torch.float16 else 1e-4
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * b.abs().max().item())


@pytest.mark.parametrize('rows', [0, -1, 1.5, True])
def test_bad_rows_raise(rows):
    s1, s2, v, la, lb = inputs(1, 1, 4, 4, 2)
    with pytest.raises(ValueError, match='rows'):
        ck.chunked(s1, s2, v, la, lb, 'v2h', rows)


def test_an_empty_map_gives_an_empty_output():
    s1, s2, v, la, lb = inputs(1, 2, 0, 5, 3, dv=2)
    assert ck.chunked(s1, s2, v, la, lb, '2d').shape == (1, 2, 0, 5, 2)


def test_bad_form_raises():
    s1, s2, v, la, lb = inputs(1, 1, 4, 4, 2)
    with pytest.raises(ValueError, match='form'):
        ck.chunked(s1, s2, v, la, lb, 'paper', 2)
    with pytest.raises(ValueError, match='form'):
        ck.chunked_counts(4, 4, 2, 2, 1, 'paper')


class _Count(TorchDispatchMode):
    """Counts what runs: multiply-adds of the matrix products and of the elementwise products whose last dim above 1
    is a feature dim (``features``; the mask tables' products are not the form's counted work), exponentials, and the
    largest tensor made other than those of the map's size (``map_sized``: copies of the inputs, the tables, the
    output)."""

    def __init__(self, features, map_sized=lambda shape: False):
        super().__init__()
        self.features, self.map_sized, self.macs, self.exps, self.largest = features, map_sized, 0, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name == 'mm':
            self.macs += args[0].shape[0] * args[0].shape[1] * args[1].shape[1]
        elif name == 'bmm':
            self.macs += args[0].shape[0] * args[0].shape[1] * args[0].shape[2] * args[1].shape[2]
        elif name == 'mul' and ([1] + [n for n in out.shape if n > 1])[-1] in self.features:
            self.macs += out.numel()  # (an einsum over one row multiplies: its output ends in a dim of 1)
        elif name == 'exp':
            self.exps += out.numel()
        if isinstance(out, torch.Tensor) and not self.map_sized(out.shape):
            self.largest = max(self.largest, out.numel())
        return out


@pytest.mark.parametrize('form, h, w, rows', [('v2h', 4, 5, 2), ('h2v', 4, 5, 2), ('v2h', 9, 5, 4),
                                              ('h2v', 9, 5, 1), ('v2h', 8, 11, 2)])
def test_counts_match_the_operations_that_run(form, h, w, rows):
    """chunked_counts against the multiply-adds and exponentials the torch form runs (one path; d 3, c 7: no mask
    table has a dim of 3, 7 or 21) and its largest intermediate besides the map-sized tensors (the inputs' copies,
    the tables, the output)."""
    d, c = 3, 7
    s1, s2, v, la, lb = (t.float() for t in inputs(1, 1, h, w, d, 0, dv=c))
    hh, ww = ck.oriented(h, w)
    assert ck.scan_block(ww, d * c) not in (d, c, d * c) and rows not in (d, c, d * c)

    def map_sized(shape):
        return any(tuple(shape[-3:]) in ((a, b, d), (a, b, c)) or tuple(shape[-2:]) in ((a, b), (a + 1, b))
                   for a, b in ((h, w), (hh, ww)))
    with _Count({d, c, d * c}, map_sized) as count:
        ck.chunked(s1, s2, v, la, lb, form, rows)
    counted = ck.chunked_counts(h, w, d, c, rows, form)
    assert (count.macs / (h * w), count.exps / (h * w), count.largest * 4) == tuple(counted)


def test_counts_by_hand():
    """A 2 x 1 map, d = c = 1, chunks of one row, V2H. Inside the chunks: 2 scores of 1 + 1 multiply-adds and 1
    exponential each. Down pass: the top chunk enters the state (1 weight, s2 times it and the outer product: 2
    multiply-adds), the bottom chunk reads it (1 decay; 2 multiply-adds: decay and contraction; the row scan of a
    1-token row: 1 multiply-add, 1 exponential). The up pass the same. Per token: (4 + 2 * 5) / 2 and
    (2 + 2 * 3) / 2. The dense form: N (d + c) and N per path."""
    assert tuple(ck.chunked_counts(2, 1, 1, 1, 1, 'v2h')) == (7.0, 4.0, 4)
    assert tuple(ck.dense_counts(2, 1, 1, 1, 'v2h')) == (4, 2, 16)
    assert tuple(ck.dense_counts(56, 56, 32, 32, '2d')) == (3136 * 64, 2 * 3136, 4 * 3136 ** 2)
    # a line of 10 in blocks of 4: 3 blocks (12 padded), per direction 3 * 16 tile + 2 * 12 state + 9 across terms
    assert ck.scan_counts(10, 5, 4) == (2 * (48 + 24 + 9) * 5, 2 * (48 + 24 + 9), 12 * 5)
    assert ck.scan_counts(10, 5, 16) == (100 * 5, 100, 100)


@pytest.mark.parametrize('h, w', [(200, 336), (100, 168), (128, 128)])
def test_the_chosen_chunk_meets_the_budget(h, w):
    """d = c = 32, one path, PPMLA with its own normalizer: at most 1.3 x the dense form's 3136 (2 d + c)
    multiply-adds per token at 56 x 56, and no intermediate as large as the N x d x c field; the chosen rows minimise
    the counted work."""
    d = c = 32
    hh, ww = ck.oriented(h, w)
    assert ww == min(h, w)
    _, chunked = ck.linear_counts(h, w, d, c)
    assert chunked.macs <= 1.3 * 3136 * (2 * d + c)
    assert chunked.largest < h * w * d * c * 4
    rows = ck.chunk_rows(h, w, d, c)
    best = min(ck.chunked_counts(h, w, d, c, r).macs for r in range(1, hh + 1))
    assert ck.chunked_counts(h, w, d, c, rows).macs == best


def test_an_input_wider_than_tall_runs_transposed():
    """A 3 x 10 map: the chunks run along its 10 columns (1-row chunks of the transposed map), as the oracle."""
    assert ck.oriented(3, 10) == (10, 3) and ck.oriented(10, 3) == (10, 3)
    leaves = _leaves((1, 1, 3, 10), 'none', 'random', seed=5)
    with _Count({4, 3, 12}) as count:
        got = _chunked('v2h', 1, 'none')(*leaves)
    assert count.largest < 30 * 30  # no 30 x 30 mask: the chunks are single rows of the transposed map
    torch.testing.assert_close(got, masked_linear(*leaves, form='v2h', feature='identity', normalize=False))



def test_the_torch_path_crossover():
    """The chunked form where the scan form's N x d x c field passes 32 MiB per image and head (detection maps),
    the scan form below (classification maps, the normalizer's field of one value channel) and while exporting."""
    from mmppma.ops.export import export_mode
    from mmppma.ops.linear.torch_impl import uses_chunked
    assert not uses_chunked(56, 56, 32, 32, '2d') and not uses_chunked(64, 128, 32, 32, 'v2h')  # 12.25, 32 MiB
    assert uses_chunked(64, 129, 32, 32, 'v2h') and uses_chunked(200, 336, 32, 32, '2d')
    assert uses_chunked(100, 168, 32, 32, 'h2v') and uses_chunked(128, 128, 32, 32, '2d')
    assert not uses_chunked(200, 336, 32, 1, '2d') and not uses_chunked(200, 336, 8, 8, '2d')  # 8.2, 16.4 MiB
    with export_mode():
        assert not uses_chunked(200, 336, 32, 32, '2d')


@pytest.mark.parametrize('normalizer', ['none', 'separate'])
def test_the_torch_path_past_the_crossover_equals_the_oracle(normalizer, monkeypatch):
    """With the crossover at 0 bytes the torch path's plan runs the chunked form (at the rows it chooses: the whole
    map for the output's product at this size, single rows for the normalizer's), with autograd and without, as the
    oracle."""
    from mmppma.ops.linear import torch_impl
    ran = []
    monkeypatch.setattr(torch_impl, 'CHUNKED_FIELD_BYTES', 0)
    monkeypatch.setattr(torch_impl, 'chunked', lambda *a, **k: ran.append(1) or ck.chunked(*a, **k))
    leaves = _leaves((1, 1, 12, 5), normalizer, 'random', seed=11, dv=16)
    options = ('2d', 2) if normalizer == 'none' else ('2d', reference.FEATURE_MAPS['elu'], True, 1e-6, 2)
    op = 'ppma_decomposed_attention' if normalizer == 'none' else 'ppma_linear_attention'
    plan = getattr(torch_impl, op + '_plan')(*leaves, *options)
    want = out_and_grads(lambda *t: masked_linear(*t, form='2d', normalize=normalizer != 'none',
                                                  feature='identity' if normalizer == 'none' else 'elu'), leaves)
    with torch.no_grad():
        out = plan(*leaves)
    products = [16] if normalizer == 'none' else [16, 1]  # the output's value channels (and the normalizer's)
    assert len(ran) == sum(torch_impl.uses_chunked(12, 5, 4, c, '2d') for c in products) >= 1
    torch.testing.assert_close(out, want[0], rtol=1e-9, atol=1e-12 * want[0].abs().max().item())
    ran.clear()
    got = out_and_grads(plan, leaves)
    assert len(ran) == sum(torch_impl.uses_chunked(12, 5, 4, c, '2d') for c in products)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12 * max(1.0, b.abs().max().item()))


def test_the_chunked_form_saves_its_inputs_only():
    """Under autograd the chunked form keeps nothing for the backward but its inputs (16 x 16, d = c = 8, V2H, in
    chunks of 1 and 3 rows): less than the scan form, which keeps its field of d x c states."""
    from mmppma.ops.linear import torch_impl
    leaves = [t.requires_grad_() for t in inputs(1, 1, 16, 16, 8, 2, torch.float32, 8)]

    def saved(core):
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            reference.decomposed(functools.partial(core, form='v2h'), *leaves)
        return sum(storages.values())
    inputs_bytes = sum(t.numel() * t.element_size() for t in leaves)
    assert saved(functools.partial(ck.chunked, rows=1)) == saved(functools.partial(ck.chunked, rows=3)) == inputs_bytes
    assert saved(functools.partial(torch_impl.decomposed_scan, chunk=64)) > 2 * inputs_bytes


def test_the_method_doc_shows_the_counted_table():
    """docs/method.md §5 shows budget_table() as the counts give it now."""
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / 'docs' / 'method.md').read_text()
    assert ck.budget_table() in doc
