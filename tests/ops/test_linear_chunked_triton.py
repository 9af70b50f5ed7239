"""The chunked form on the Triton path (mmppma/ops/linear/chunked_triton.py) on the interpreter against the float64
dense oracle: every form, odd and one-line maps, chunks that do not divide the map, the state carried over three
chunks and more, PPMLA and PPMDA through the ops with gradients, half precision; the plan's choice and the
forward's memory on meta tensors."""
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmppma import ops

from ..conftest import REPO_ROOT
from .oracle import inputs, masked_linear, out_and_grads

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')

from mmppma.ops.linear import chunked_triton as ct  # noqa: E402
from mmppma.ops.linear import triton_impl  # noqa: E402
from mmppma.ops.triton_support import launch as lp  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


def _oracle(form, *tensors, feature='identity', normalize=False):
    return masked_linear(*(t.detach().double() for t in tensors), form=form, feature=feature, normalize=normalize)


def _close(got, want, name='out', rtol=1e-4, atol=1e-5):
    assert torch.isfinite(got).all(), name
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol * want.abs().max().item(), msg=name)


# (form, (B, heads, H, W), chunk rows): the map as given for V2H, transposed for H2V
FORWARD = [
    ('2d', (1, 1, 7, 7), 3),  # three chunks each way
    ('h2v', (1, 1, 5, 9), 2),  # five chunks of the transposed map
    ('v2h', (1, 1, 9, 5), 4),  # H not a multiple of the rows: a short last chunk
    ('2d', (1, 1, 1, 12), 5),  # one row: V2H one chunk, H2V three chunks of one-token rows
    ('2d', (1, 1, 12, 1), 5),
]


@pytest.mark.parametrize('form, shape, rows', FORWARD, ids=str)
def test_forward_equals_the_float64_oracle(form, shape, rows):
    q, k, v, la, lb = (t.to(DEVICE) for t in inputs(*shape, 4, sum(shape), torch.float32, 3))
    got = triton_impl.chunked_form(q, k, v, la, lb, form, rows=rows)
    assert got.dtype == torch.float32 and got.shape == v.shape
    _close(got, _oracle(form, q, k, v, la, lb))


def test_one_chunk_is_one_launch_and_exact():
    """With the chunk the whole map the form is its own keys' part alone: one query launch, equal to the oracle."""
    q, k, v, la, lb = (t.to(DEVICE) for t in inputs(1, 1, 6, 3, 4, 3, torch.float32, 3))
    with lp.recording(90) as launches:
        triton_impl.chunked_form(*(t.to('meta') for t in (q, k, v, la, lb)), 'v2h', rows=6)
    assert [(x.name, x.constexprs['HAS_STATE'], x.constexprs['INTRA']) for x in launches] == [('_queries', False, True)]
    _close(triton_impl.chunked_form(q, k, v, la, lb, 'v2h', rows=6), _oracle('v2h', q, k, v, la, lb))


@pytest.fixture
def forced(monkeypatch):
    """The ops' Triton path takes the chunked form at every size, in chunks of 2 rows, with the log-decays'
    gradients too."""
    monkeypatch.setattr(triton_impl, 'runs_chunked', lambda *args, **kwargs: True)
    monkeypatch.setattr(ct, 'CHUNK_ROWS', 2)
    ops.clear_caches()
    yield
    ops.clear_caches()


def _leaves(shape, seed, separate, dtype=torch.float32):
    q, k, v, la, lb = inputs(*shape, 4, seed, torch.float32, 3)
    extra = list(inputs(*shape, 4, seed + 7, torch.float32)[:2]) if separate else []
    return [t.to(DEVICE, dtype if i < 3 or i > 4 else torch.float32).requires_grad_()
            for i, t in enumerate((q, k, v, la, lb, *extra))]


def test_ppmla_with_a_separate_normalizer_and_gradients(forced):
    """PPMLA (elu features, normalized by a separate q', k') through the op: output and the gradients of q, k, v,
    la, lb, q', k', the state over three chunks (6 rows in chunks of 2)."""
    leaves = _leaves((1, 1, 6, 3), 5, True)

    def op(q, k, v, la, lb, qn, kn):
        return ops.ppma_linear_attention(q, k, v, la, lb, form='v2h', feature_map='elu', normalize=True,
                                         normalizer=(qn, kn), impl='triton')
    with lp.recording(0) as launches:  # on meta tensors: the path taken
        op(*(t.detach().to('meta') for t in leaves))
    assert {x.name for x in launches} == {'_queries', '_update'}
    got = out_and_grads(op, leaves)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want = out_and_grads(lambda *t: masked_linear(*t, form='v2h', feature='elu', normalize=True), wide)
    for name, a, b in zip(['out', 'q', 'k', 'v', 'la', 'lb', "q'", "k'"], got, want):
        _close(a, b, name)


def test_ppmda_2d_gradients(forced):
    """PPMDA, '2d', through the op: output and the gradients of s1, s2, v, la, lb (V2H in three chunks of the
    5 x 3 map, H2V in two of the transposed one)."""
    leaves = _leaves((1, 1, 5, 3), 2, False)

    def op(s1, s2, v, la, lb):
        return ops.ppma_decomposed_attention(s1, s2, v, la, lb, form='2d', impl='triton')
    got = out_and_grads(op, leaves)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want = out_and_grads(lambda *t: masked_linear(*t, form='2d', feature='identity', normalize=False), wide)
    for name, a, b in zip(['out', 's1', 's2', 'v', 'la', 'lb'], got, want):
        _close(a, b, name)


def test_ppmla_normalized_by_its_own_features(forced):
    leaves = [t.detach() for t in _leaves((1, 2, 5, 4), 9, False)]
    got = ops.ppma_linear_attention(*leaves, form='h2v', feature_map='elu', normalize=True, impl='triton')
    _close(got, _oracle('h2v', *leaves, feature='elu', normalize=True))


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_inputs(forced, dtype):
    """fp16 / bf16 q, k, v: output and input gradients finite and within 1e-2 in relative norm of float64 on the
    same (rounded) inputs (the gradients relative to the largest one's norm); the output in the inputs' dtype."""
    leaves = _leaves((1, 1, 4, 2), 4, False, dtype)

    def op(q, k, v, la, lb):
        return ops.ppma_linear_attention(q, k, v, la, lb, form='v2h', feature_map='elu', normalize=True,
                                         impl='triton')
    got = out_and_grads(op, leaves)
    assert got[0].dtype == dtype
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want = out_and_grads(lambda *t: masked_linear(*t, form='v2h', feature='elu', normalize=True), wide)
    scale = max(torch.linalg.vector_norm(b) for b in want[1:])  # the cotangent itself is rounded to the dtype
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.isfinite(a).all(), i
        err = torch.linalg.vector_norm(a.double() - b) / (torch.linalg.vector_norm(b) if i == 0 else scale)
        assert err <= 1e-2, (i, err.item())


def test_bad_arguments_raise():
    q, k, v, la, lb = inputs(1, 1, 3, 3, 4, 0, torch.float32, 3)
    with pytest.raises(ValueError, match='rows'):
        triton_impl.chunked_form(q, k, v, la, lb, 'v2h', rows=0)
    with pytest.raises(ValueError, match='form'):
        triton_impl.chunked_form(q, k, v, la, lb, 'diagonal')
    with pytest.raises(ValueError, match='s1, s2'):
        triton_impl.chunked_form(q, k[:, :, :2], v, la, lb, 'v2h')


def test_the_plan_chooses_by_counted_work():
    """The dense kernels at small maps, the chunked form at detection-sized ones; the choice is the counts'."""
    assert not ct.uses_chunked_triton(16, 16, 32, 32, '2d')
    assert not ct.uses_chunked_triton(56, 56, 32, 32, '2d')
    assert ct.uses_chunked_triton(128, 128, 32, 32, '2d')
    assert ct.uses_chunked_triton(200, 336, 32, 32, '2d')
    assert ct.uses_chunked_triton(800, 1344, 32, 32, '2d')
    with pytest.raises(ValueError, match='positive'):
        ct.chunked_triton_macs(0, 4, 32, 32)


@pytest.mark.parametrize('h, w, d, c, form, rows', [(37, 21, 8, 8, '2d', 4), (9, 30, 4, 3, 'h2v', 2),
                                                    (5, 5, 2, 2, 'v2h', 16)], ids=str)
def test_the_count_is_what_the_launches_run(h, w, d, c, form, rows):
    """chunked_triton_macs equals the multiply-adds of the recorded launches, each counted from its grid and
    flags: a query row's two sweeps of W steps (its chunk's keys when INTRA, the scan and the contraction, the
    state when HAS_STATE), an update's rows and its decay of the state it holds."""
    s1, s2 = (torch.empty(1, 1, h, w, d, device='meta') for _ in range(2))
    v = torch.empty(1, 1, h, w, c, device='meta')
    la, lb = (torch.empty(1, 1, h, w, device='meta') for _ in range(2))
    with lp.recording(90) as launches:
        ct.chunked_triton(s1, s2, v, la, lb, form, rows=rows)
    dc, macs = d * c, 0
    for x in launches:
        width = x.args[-3]  # W of the map (or of the transposed one) the launch runs on
        if x.name == '_queries':
            k, n = x.constexprs, x.args[8]  # the chunk's rows
            assert x.grid[1] == n
            macs += n * width * 2 * (k['INTRA'] * n * dc + 2 * dc + k['HAS_STATE'] * dc)
        else:
            assert x.name == '_update'
            macs += x.args[5] * width * dc + (not x.constexprs['FRESH']) * width * dc
    assert macs / (h * w) == pytest.approx(ct.chunked_triton_macs(h, w, d, c, form, rows), rel=1e-12)
    assert len(launches) == ct.forward_launch_count(h, w, form, rows)


def test_budget_table_in_docs_is_current():
    """docs/method.md §5 shows the Triton path's budget_table() as the counts give it now; the chunked form's work
    per token at the detection and segmentation maps is at most 1.3x the dense kernels' at 56 x 56."""
    doc = (REPO_ROOT / 'docs' / 'method.md').read_text()
    assert ct.budget_table() in doc
    base = 56 * 56 * (2 * 32 + 32)
    for h, w in ((128, 128), (100, 168), (200, 336)):
        assert ct.uses_chunked_triton(h, w, 32, 32, '2d')
        assert ct.chunked_triton_macs(h, w, 32, 32, '2d') + ct.chunked_triton_macs(h, w, 32, 1, '2d') <= 1.3 * base


def test_the_plan_runs_the_chunked_form_at_large_maps():
    """At 200 x 336 the chunked form runs (in inference and in training: its backward computes every gradient); at
    56 x 56 the dense kernels; never while torch.compile traces."""
    s1, v = (torch.empty(1, 1, 200, 336, 32, device='meta') for _ in range(2))
    assert triton_impl.runs_chunked(s1, v, '2d', False)
    assert not triton_impl.runs_chunked(s1, v, '2d', True)  # torch.compile traces
    small = torch.empty(1, 1, 56, 56, 32, device='meta')
    assert not triton_impl.runs_chunked(small, small, '2d', False)


# (form, (B, heads, H, W), d, c, chunk rows): gradients of the form itself
BACKWARD = [
    ('2d', (1, 1, 5, 4), 5, 40, 2),  # two value-channel blocks, d not a power of two, both paths in chunks
    ('v2h', (1, 2, 7, 4), 3, 1, 3),  # the mass (one channel), a short last chunk, two heads
    ('2d', (2, 1, 1, 9), 4, 4, 2),  # one row: V2H one chunk, H2V five chunks; two images
    ('2d', (1, 1, 9, 1), 4, 4, 2),  # one column: V2H five chunks of one-token rows, H2V one chunk
]


@pytest.mark.parametrize('form, shape, d, c, rows', BACKWARD, ids=str)
def test_backward_equals_the_float64_oracle(form, shape, d, c, rows):
    """The gradients of s1, s2, v, la and lb (the pairs inside each chunk and between chunks) against the float64
    oracle's."""
    gen = torch.Generator().manual_seed(sum(shape) + d + c)
    s1, s2 = (torch.randn(*shape, d, generator=gen) for _ in range(2))
    v = torch.randn(*shape, c, generator=gen)
    la, lb = (-0.05 - 0.7 * torch.rand(*shape, generator=gen) for _ in range(2))
    leaves = [t.to(DEVICE).requires_grad_() for t in (s1, s2, v, la, lb)]
    got = out_and_grads(lambda *t: triton_impl.chunked_form(*t, form, rows=rows), leaves)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want = out_and_grads(lambda *t: masked_linear(*t, form=form, feature='identity', normalize=False), wide)
    for name, a, b in zip(['out', 's1', 's2', 'v', 'la', 'lb'], got, want):
        _close(a, b, name)


class _Allocations(TorchDispatchMode):
    """The sizes of every tensor allocated in the block."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sizes += [t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                       if isinstance(t, torch.Tensor)]
        return out


def _record(h, w, d, c, cap=90, backward=False):
    """The launches of PPMDA '2d' on meta tensors at an H x W map (its forward, or with ``backward`` its backward
    after an unrecorded forward), and every tensor allocated meanwhile."""
    s1, s2 = (torch.empty(1, 2, h, w, d, device='meta', requires_grad=backward) for _ in range(2))
    v = torch.empty(1, 2, h, w, c, device='meta', requires_grad=backward)
    la, lb = (torch.empty(1, 2, h, w, device='meta', requires_grad=backward) for _ in range(2))
    ops.clear_caches()
    with lp.recording(cap) as launches:
        with _Allocations() if not backward else contextlib.nullcontext() as allocations:
            out = ops.ppma_decomposed_attention(s1, s2, v, la, lb, form='2d', impl='triton')
        if backward:
            del launches[:]
            with _Allocations() as allocations:
                out.backward(torch.empty_like(out))
    ops.clear_caches()
    return launches, allocations.sizes


def test_the_chunked_forward_allocates_no_field_of_states():
    """At 200 x 336 the plan runs the chunked form; no tensor of its forward reaches N x d x c (per image and head;
    the rolling state, max(H, W) x d x c, is one buffer for both paths; H2V reads the map through strides, no
    transposed copies), and the dense kernel runs at 56 x 56."""
    h, w, d, c = 200, 336, 8, 8
    launches, sizes = _record(h, w, d, c)
    names = [x.name for x in launches]
    assert {'_queries', '_update'} <= set(names)
    assert max(sizes) < 2 * h * w * d * c // 4  # B * heads = 2; the inputs are 2 N d
    states = {id(x.args[5] if x.name == '_queries' else x.args[3]) for x in launches}
    assert len(states) == 1 and 2 * w * d * c in sizes  # one state for both paths
    # all it allocates (float32 inputs): the two tables, the state and the output; no copy of the inputs
    assert sorted(sizes) == [2 * w * d * c, 2 * h * w, 2 * h * w, 2 * h * w * c]
    # H2V on the transposed map (336 rows): 21 chunks of 16; V2H: 13; per path and chunk a query launch of the down
    # walk, per chunk boundary one of the up walk and per walk and boundary an update
    assert names.count('_queries') == 13 + 12 + 21 + 20 and names.count('_update') == 2 * (12 + 20)
    assert len(names) == ct.forward_launch_count(h, w, '2d')  # the chunks' own keys in the query launches: no dense one
    small, _ = _record(56, 56, 32, 32)
    assert [x.name for x in small] == ['_ppmla_fwd']


def test_the_chunked_backward_allocates_no_field_of_states():
    """At 200 x 336 the backward's walks allocate no tensor of N x d x c either: their scratch is two max(H, W) x d x c
    states and one chunk's rows of queries (R x max(H, W) x d x c) for both paths; the largest tensors are the
    gradients' per value block (N x d)."""
    h, w, d, c = 200, 336, 8, 8
    launches, sizes = _record(h, w, d, c, backward=True)
    names = [x.name for x in launches]
    assert max(sizes) < 2 * h * w * d * c // 4
    assert 2 * ct.CHUNK_ROWS * w * d * c in sizes  # the chunk's queries
    # per path and walk a query launch per chunk, a key launch per chunk that meets something (every chunk of the
    # down walk, all but the first of the up walk) and two updates per boundary
    assert set(names) == {'_grad_queries', '_grad_keys', '_update', '_update_queries'}
    assert names.count('_grad_queries') == 2 * (13 + 21)
    assert names.count('_grad_keys') == 13 + 12 + 21 + 20
    assert names.count('_update') == names.count('_update_queries') == 2 * (12 + 20)
