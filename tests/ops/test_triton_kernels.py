"""Every Triton kernel against the dense reference, outputs and all gradients, float32; fp16 / bf16 vs float32.

On a machine without a GPU (CI) the kernels run under ``TRITON_INTERPRET=1`` (see conftest.py); with a GPU
they run compiled on CUDA. Shapes cover N = 49 and 196, a 5 x 37 map (a row wider than a tile), 1 x N and
N x 1 maps, a 21 x 3 map (whole attention runs it transposed), and lengths that leave a ragged last block
(checked against the tiles by ``test_shapes_span_several_ragged_blocks``).
"""
import dataclasses
from functools import partial

import pytest
import torch

import mmppma.ops.criss_cross
import mmppma.ops.whole
from mmppma.ops import (
    criss_cross_attention,
    decay_scan_1d,
    manhattan_attention,
    polyline_mask_matvec,
    polyline_mask_matvec_3d,
    ppma_attention,
    ppma_linear_attention,
    rmt_criss_cross_attention,
)
from mmppma.ops.dispatch import resolve_impl

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mmppma.ops.triton_support import launch as lp  # noqa: E402
from mmppma.ops.triton_support import preflight  # noqa: E402
from mmppma.ops.triton_support.tiles import slice_offset  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
TOL = dict(rtol=2e-4, atol=2e-5)


def make(b, heads, h, w, d, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(b, heads, h, w, n, generator=g) for n in (d, d, dv or d)]
    return [t.to(DEVICE).requires_grad_() for t in qkv + [-torch.rand(b, heads, h, w, generator=g) for _ in 'ab']]


def outputs_and_grads(fn, inputs, seed=1):
    out = fn(*inputs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device)
    grads = torch.autograd.grad(out, [t for t in inputs if t.requires_grad], g, allow_unused=True)
    return [out] + [torch.zeros_like(t) if gr is None else gr for t, gr in zip(inputs, grads)]


def assert_same(op, inputs):
    """``op(*inputs, impl='triton')`` against ``impl='reference'``: the output and every input's gradient."""
    got = outputs_and_grads(partial(op, impl='triton'), inputs)
    want = outputs_and_grads(partial(op, impl='reference'), inputs)
    names = ['out'] + [f'grad[{i}]' for i in range(len(inputs))]
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f'{name}: {m}')


WHOLE_SHAPES = [(2, 2, 7, 7, 16, 16), (1, 1, 14, 14, 32, 32), (1, 1, 5, 37, 16, 8), (1, 1, 1, 9, 16, 16),
                (1, 1, 9, 1, 64, 16), (1, 1, 3, 5, 4, 3), (1, 1, 21, 3, 16, 8)]
LINE_SHAPES = [(1, 2, 7, 7, 16, 16), (1, 1, 5, 37, 16, 8), (1, 1, 1, 9, 16, 16), (1, 1, 9, 1, 32, 16),
               (1, 1, 35, 3, 16, 16)]
SCAN_LENGTHS = [1, 5, 32, 33, 70]
SHAPE_ID = dict(ids=lambda s: 'x'.join(map(str, s)))


@pytest.mark.parametrize('form', ['release', 'v2h', 'h2v'])
@pytest.mark.parametrize('op, shape', [(ppma_attention, s) for s in WHOLE_SHAPES] +
                         [(criss_cross_attention, s) for s in LINE_SHAPES],
                         ids=lambda x: 'x'.join(map(str, x)) if isinstance(x, tuple) else x.__name__)
def test_attention_kernel(op, shape, form):
    """Whole attention on the whole-attention shapes, criss-cross attention on the line shapes."""
    b, heads, h, w, d, dv = shape
    assert_same(partial(op, scale=d**-0.5, form=form), make(b, heads, h, w, d, dv, seed=h * w))


def launched(monkeypatch):
    """The list that every launch the ops run from now on is appended to (and still run)."""
    ran, run = [], lp.run
    monkeypatch.setattr(lp, 'run', lambda launches: run(ran.extend(launches) or launches))
    return ran


@pytest.mark.parametrize('shape', [WHOLE_SHAPES[0], WHOLE_SHAPES[2]], **SHAPE_ID)
def test_whole_kernel_with_corner_sums_in_programs_of_their_own(shape, monkeypatch):
    """``corner_pass`` (the half-precision tiles on sm_80 / sm_86 / sm_89) moves the corner-gradient sums out of
    the programs that accumulate dq, dk, dv into programs of their own: forced on here for both paths' corner
    programs, the gradients still equal the reference's, and the launches show the split."""
    config = lp.config
    monkeypatch.setattr(lp, 'config', lambda *a, **kw: dataclasses.replace(config(*a, **kw), corner_pass=True))
    ran = launched(monkeypatch)
    b, heads, h, w, d, dv = shape
    assert_same(partial(ppma_attention, scale=d**-0.5), make(b, heads, h, w, d, dv, seed=h + w))
    parts = {(x.constexprs['KEYS'], x.constexprs['GRADS'], x.constexprs['CORNER_SUMS']) for x in ran
             if x.name == '_whole_bwd' and (x.constexprs['FORM'] == 'h2v') == x.constexprs['KEYS']}
    assert parts == {(keys, grads, not grads) for keys in (True, False) for grads in (True, False)}, parts


def test_narrow_tall_image_runs_transposed(monkeypatch):
    """Whole attention on an image narrower than ``lp.NARROW`` tokens and at least that tall launches its kernels
    on the transpose (a block of tokens then spans few image rows): every launch sees tables of 3 rows of 21
    tokens. Values: RMT's Manhattan attention (V2H only, so H2V on the transpose) here, PPMA's forms in
    test_attention_kernel's 21 x 3 map."""
    ran = launched(monkeypatch)
    q, k, v, la, lb = make(1, 2, 21, 3, 16)
    gamma = torch.tensor([-0.3, -0.9], device=DEVICE)
    assert_same(lambda *a, impl: manhattan_attention(*a, gamma, scale=0.25, impl=impl), [q, k, v])
    ppma_attention(q, k, v, la, lb, impl='triton').sum().backward()
    tables = {tuple(x.args[3].shape[-2:]) for x in ran if x.name.startswith('_whole')}
    assert tables == {(3, 21)}, tables


def _tensors(*shapes, seed=0, negative=False):
    g = torch.Generator().manual_seed(seed)
    return [(-torch.rand(*s, generator=g) if negative else torch.randn(*s, generator=g)).to(DEVICE).requires_grad_()
            for s in shapes]


GAMMA3 = torch.tensor([-0.1, -0.4, -1.2], device=DEVICE)
# name: (op taking impl=, a function making its inputs)
KERNEL_CASES = {
    'manhattan': (lambda *a, impl: manhattan_attention(*a, GAMMA3, scale=0.25, impl=impl),
                  lambda: make(2, 3, 5, 6, 16)[:3]),
    'rmt_criss_cross': (lambda *a, impl: rmt_criss_cross_attention(*a, GAMMA3, scale=0.25, impl=impl),
                        lambda: make(2, 3, 5, 6, 16)[:3]),
    **{f'decay_scan length {n}': (decay_scan_1d, lambda n=n: _tensors((3, n, 5), seed=n) + _tensors(
        (3, n), seed=n, negative=True)) for n in SCAN_LENGTHS},
    **{f'matvec {form}': (partial(polyline_mask_matvec, form=form), lambda: make(1, 2, 7, 7, 4, seed=3)[2:])
       for form in ('v2h', 'h2v', '2d')},
    'linear': (partial(ppma_linear_attention, feature_map='elu', normalize=True), lambda: make(1, 2, 7, 7, 4, seed=3)),
    'matvec_3d': (polyline_mask_matvec_3d, lambda: _tensors((1, 2, 2, 3, 4, 3)) + _tensors(
        *[(1, 2, 2, 3, 4)] * 3, seed=1, negative=True)),
    # the backward folds the log-normaliser divided by the scale into the scores' product: a zero scale (scores
    # of zero, the bias alone) and a negative one
    **{f'whole scale {scale}': (partial(ppma_attention, scale=scale), lambda: make(1, 1, 5, 7, 16, seed=3))
       for scale in (0.0, -0.5)},
}


@pytest.mark.parametrize('name', KERNEL_CASES)
def test_kernel_equals_reference(name):
    op, inputs = KERNEL_CASES[name]
    assert_same(op, inputs())


def test_extreme_decays_in_kernels_stay_finite():
    q, k, v, la, lb = make(1, 2, 5, 9, 16)
    with torch.no_grad():
        la -= 1e4
        lb -= 1e4
    for op in (ppma_attention, criss_cross_attention):
        out, *grads = outputs_and_grads(partial(op, impl='triton'), [q, k, v, la, lb])
        assert torch.isfinite(out).all() and all(torch.isfinite(g_).all() for g_ in grads)


def test_shapes_span_several_ragged_blocks():
    """The shapes above reach the kernels' block edges at the tiles the ops choose on this device: a map of several
    blocks, not a multiple of either tile, wider than both (an image row spans blocks); lines of both axes longer
    than a block and not a multiple of it; scans of exactly one block and of several ragged ones."""
    cap = lp.capability(torch.device(DEVICE))
    for family in ('whole_fwd', 'whole_bwd_q', 'whole_bwd_kv'):
        assert any(
            h * w > 2 * cfg.block_m and h * w % cfg.block_m and h * w % cfg.block_n and w > max(cfg.block_m,
                                                                                                  cfg.block_n)
            for *_, h, w, _, _ in WHOLE_SHAPES for cfg in [lp.config(family, h * w, torch.float32, cap, w)]), family
    for family in ('line_fwd', 'line_bwd'):
        for axis in (-4, -3):  # column length H, row length W
            assert any(s[axis] > max(cfg.block_m, cfg.block_n) and s[axis] % cfg.block_m and s[axis] % cfg.block_n
                       for s in LINE_SHAPES for cfg in [lp.config(family, s[axis], torch.float32, cap)]), family
    blocks = {length: lp.config('scan', length, torch.float32, cap).block_m for length in SCAN_LENGTHS}
    assert any(length == block for length, block in blocks.items())
    assert any(length > 2 * block and length % block for length, block in blocks.items())


def test_whole_kernel_backward_extra_memory_is_linear_in_n():
    """No tensor the backward allocates grows faster than N: the decay-table gradient is reduced onto the
    H x W tables in-kernel (an N x W or N x H segment table - 12 N floats each here, over the bound of 8 N -
    would fail)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestFloatTensor(TorchDispatchMode):
        largest = (0, None)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > self.largest[0]:
                    self.largest = (t.numel(), str(func))
            return out

    h, w, d = 12, 12, 2
    q, k, v, la, lb = make(1, 1, h, w, d, seed=4)
    out = ppma_attention(q, k, v, la, lb, impl='triton')
    with LargestFloatTensor() as mode:
        torch.autograd.grad(out, [q, k, v, la, lb], torch.ones_like(out))
    n = h * w
    assert mode.largest[0] <= 4 * n * d, f'backward allocated {mode.largest[0]} floats ({mode.largest[1]}), N = {n}'


@pytest.fixture
def interpreter_bf16_dot(monkeypatch):
    """Give the interpreter's ``tl.dot`` the GPU's bfloat16 semantics; nothing is patched on CUDA.

    Under ``TRITON_INTERPRET=1`` triton stores bfloat16 as uint16 and its ``tl.dot`` multiplies those bit
    patterns (triton-lang/triton#11584, answered "not supported yet"); loads, stores and casts of bfloat16 are
    exact, and the kernels do no other bfloat16 arithmetic. Widening both operands to float32 exactly (what
    the interpreter's own cast does) and accumulating in float32 is what the tensor cores compute.
    """
    if DEVICE == 'cuda':
        return
    import numpy as np
    from triton.runtime import interpreter
    original = interpreter.InterpreterBuilder.create_dot

    def widened(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, *args, **kwargs):
        return original(self, widened(a), widened(b), *args, **kwargs)

    monkeypatch.setattr(interpreter.InterpreterBuilder, 'create_dot', create_dot)


def assert_half_close(op, inputs, half_indices, dtype, bound=1e-2):
    """``op(*inputs, impl='triton')`` with the inputs at ``half_indices`` in ``dtype`` (log-decays stay float32, as
    the ops require) against the dense float32 reference ``op(..., impl='reference')`` on the same rounded values:
    output and every gradient within ``bound`` in relative norm, and the output keeps the half dtype."""
    rounded = [t.detach().to(dtype).float() if i in half_indices else t.detach() for i, t in enumerate(inputs)]
    want = outputs_and_grads(partial(op, impl='reference'), [t.requires_grad_() for t in rounded])
    half = [t.detach().to(dtype) if i in half_indices else t.detach() for i, t in enumerate(rounded)]
    got = outputs_and_grads(partial(op, impl='triton'), [t.requires_grad_() for t in half])
    assert got[0].dtype == dtype
    names = ['out'] + [f'grad[{i}]' for i in range(len(inputs))]
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all(), name
        err = ((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()
        assert err < bound, f'{name}: relative error {err:.2e} in {dtype} vs float32 (bound {bound})'


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_half_precision_kernels_close_to_float32(dtype, interpreter_bf16_dot):
    """Every kernel family with fp16 / bf16 q, k, v (float32 decay tables, float32 accumulation), forward and
    backward, against the dense float32 reference - the issue's "relative error near 1e-2 at most"."""
    whole = make(1, 2, 5, 7, 16, seed=5)
    assert_half_close(partial(ppma_attention, scale=0.25), whole, {0, 1, 2}, dtype)
    assert_half_close(partial(criss_cross_attention, scale=0.25), whole, {0, 1, 2}, dtype)
    gamma = torch.tensor([-0.2, -0.9], device=DEVICE)
    assert_half_close(lambda *a, impl: manhattan_attention(*a, gamma, scale=0.25, impl=impl), whole[:3], {0, 1, 2},
                      dtype)
    assert_half_close(partial(polyline_mask_matvec, form='2d'), whole[2:], {0}, dtype)


def test_recorded_launches_are_the_ones_the_ops_run(monkeypatch):
    """Recording on meta tensors (what the tool compiles) yields the launches a real call makes, constexprs,
    argument types and config alike: the real call's launches are captured at ``Launch.__call__``."""
    ran = []
    monkeypatch.setattr(lp.Launch, '__call__', lambda self: ran.append(self))
    monkeypatch.setattr(lp, 'capability', lambda device: 80)
    q, k, v = (torch.randn(1, 2, 5, 40, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    la, lb = (-torch.rand(1, 2, 5, 40, device=DEVICE) for _ in range(2))
    ppma_attention(q, k, v, la, lb, impl='triton').sum().backward()
    meta = [t.detach().to('meta').requires_grad_() for t in (q, k, v, la, lb)]
    with lp.recording(80) as forward:
        out = ppma_attention(*meta, impl='triton')
    with lp.recording(80) as backward:
        torch.autograd.grad(out, meta[:3], torch.empty_like(out))

    def describe(launch):
        return launch.name, launch.grid, launch.signature(), launch.constexprs, launch.config

    assert [describe(x) for x in forward + backward] == [describe(x) for x in ran]


# ----------------------------------------------------------------------------------------------- dispatch
def test_triton_errors_name_the_alternatives(monkeypatch):
    """form='paper' has no kernel; on the CPU without the interpreter the kernels cannot run."""
    with pytest.raises(NotImplementedError, match="impl='torch'"):
        ppma_attention(*make(1, 1, 2, 2, 4), form='paper', impl='triton')
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    q, k, v, la, lb = (t.detach().cpu() for t in make(1, 1, 2, 2, 4))
    with pytest.raises(RuntimeError, match="impl='torch'"):
        ppma_attention(q, k, v, la, lb, impl='triton')


def test_auto_falls_back_to_torch_when_a_kernel_cannot_run_on_the_gpu(monkeypatch):
    """Forced failure: every kernel raises OutOfResources when loaded on the (pretended) GPU. impl='auto' then
    runs the torch path with one warning naming op, shape, dtype and GPU; impl='triton' raises."""
    from triton.runtime.errors import OutOfResources

    def out_of_shared_memory(self):
        raise OutOfResources(300000, 232448, 'shared memory')

    monkeypatch.setattr(lp.Launch, 'prepare', out_of_shared_memory)
    monkeypatch.setattr(preflight, '_on_gpu', lambda t: True)
    monkeypatch.setattr(preflight, '_device_name', lambda device: 'Pretend GPU')
    monkeypatch.setattr(preflight, '_PREFLIGHT', {})
    for package in (mmppma.ops.whole, mmppma.ops.criss_cross):  # 'auto' picks triton, as on a GPU
        monkeypatch.setattr(package, 'resolve_impl',
                            lambda impl, *args: 'triton' if impl == 'auto' else resolve_impl(impl, *args))
    inputs = q, k, v, la, lb = make(1, 2, 3, 5, 16, seed=7)
    with pytest.warns(UserWarning, match=r"ppma_attention: .*Pretend GPU.*\(1, 2, 3, 5, 16\) torch.float32.*"
                                         r"OutOfResources.*impl='torch'") as record:
        got = outputs_and_grads(partial(ppma_attention, impl='auto'), inputs)
        outputs_and_grads(partial(ppma_attention, impl='auto'), inputs)
    assert len([w for w in record if 'ppma_attention' in str(w.message)]) == 1, 'one warning per input signature'
    for a, b in zip(got, outputs_and_grads(partial(ppma_attention, impl='torch'), inputs)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    monkeypatch.setattr(lp.Launch, '__call__', out_of_shared_memory)
    with pytest.raises(OutOfResources):
        ppma_attention(q, k, v, la, lb, impl='triton')
    with pytest.warns(UserWarning, match='criss_cross_attention: .*Pretend GPU'):
        criss_cross_attention(q, k, v, la, lb, impl='auto')


@triton.jit
def _offset_probe(out_ptr, index, n, d):
    tl.store(out_ptr, slice_offset(index, n, d))


def test_slice_offsets_are_int64():
    """batch * heads * N * d past 2**31: the kernels' slice offset (``slice_offset``) stays exact, and the line
    and scan kernels' bases are computed in int64 the same way."""
    out = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    index, n, d = 70000, 8192, 64  # 3.7e10 > 2**31; each factor an int32 argument
    _offset_probe[(1, )](out, index, n, d)
    assert out.item() == index * n * d
