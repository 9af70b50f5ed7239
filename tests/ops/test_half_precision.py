"""The ops in float16 and bfloat16, on CPU (the torch path) and on the simulated GPU (the kernels), against float32 on
the same rounded inputs: no decay, decays of -30 and below, scores of 1e5 (past float16's range), and the largest
shipped stage-1 map (200 x 336) for the stage-1 ops. Outputs within 1e-2 (float16) / 3e-2 (bfloat16) in relative
norm; every gradient within twice that of the call's largest gradient norm (a gradient that is exactly zero in
float32, such as q's when the decays leave each token only itself, is rounding noise in half precision)."""
import pytest
import torch

from mmppma import ops
from mmppma.ops import devices

DTYPES = {'fp16': torch.float16, 'bf16': torch.bfloat16}
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2}


def rmt_decay(q):
    return torch.linspace(-0.2, -0.6, q.shape[1])


#: op -> call(q, k, v, la, lb, impl)
OPS = {
    **{f'ppma_attention-{form}': (lambda *t, impl, form=form: ops.ppma_attention(*t, form=form, impl=impl))
       for form in ('release', 'v2h', 'h2v', 'paper')},
    **{f'criss_cross_attention-{form}': (lambda *t, impl, form=form: ops.criss_cross_attention(*t, form=form,
                                                                                               impl=impl))
       for form in ('release', 'v2h', 'h2v')},
    'manhattan_attention': lambda q, k, v, la, lb, impl: ops.manhattan_attention(q, k, v, rmt_decay(q), impl=impl),
    'rmt_criss_cross_attention': lambda q, k, v, la, lb, impl: ops.rmt_criss_cross_attention(q, k, v, rmt_decay(q),
                                                                                             impl=impl),
    'ppma_linear_attention': lambda *t, impl: ops.ppma_linear_attention(*t, feature_map='elu', normalize=True,
                                                                        impl=impl),
    'ppma_decomposed_attention': lambda *t, impl: ops.ppma_decomposed_attention(*t, impl=impl),
    'polyline_mask_matvec': lambda q, k, v, la, lb, impl: ops.polyline_mask_matvec(v, la, lb, form='2d', impl=impl),
}
#: the log-decays, and the largest |score| the inputs are scaled to (None: unit-variance q, k)
CASES = {'no-decay': (lambda g, s: -1e-6 * torch.rand(s, generator=g), None),
         'decay-30': (lambda g, s: -30 - 10 * torch.rand(s, generator=g), None),
         'scores-1e5': (lambda g, s: -torch.rand(s, generator=g), 1e5)}


def small(op):
    """The shape of the small cases: 5 x 7 tokens, 2 heads; d = 4 for the linear attention (its work grows with
    d^2, and q, k with few channels reach features ~0 at large scores, where its gradients are hardest)."""
    return (1, 2, 5, 7, 4 if op == 'ppma_linear_attention' else 16)


def make_inputs(shape, case, dtype, seed=0):
    """q, k, v rounded to ``dtype`` and float32 log-decays; with a score bound, q and k scaled so that the largest
    |q . k| is it."""
    g = torch.Generator().manual_seed(seed)
    b, heads, h, w, d = shape
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    decays, bound = CASES[case]
    if bound is not None:
        top = torch.einsum('bhnd,bhmd->bhnm', q.flatten(2, 3), k.flatten(2, 3)).abs().max()
        q, k = q * (bound / top).sqrt(), k * (bound / top).sqrt()
    return [t.to(dtype) for t in (q, k, v)] + [decays(g, (b, heads, h, w)) for _ in range(2)]


def check(call, inputs, dtype, impl):
    half = [t.clone().requires_grad_() for t in inputs]
    full = [t.detach().float().requires_grad_() for t in inputs]
    out, want = call(*half, impl=impl), call(*full, impl='torch')
    assert out.dtype == dtype and torch.isfinite(out).all()
    error = ((out.float() - want).norm() / want.norm()).item()
    assert error <= TOLERANCE[dtype], error
    cotangent = torch.linspace(-1, 1, want.numel()).view_as(want)
    got = torch.autograd.grad(out, half, cotangent.to(dtype), allow_unused=True)
    grads = torch.autograd.grad(want, full, cotangent, allow_unused=True)
    scale = max(g.norm() for g in grads if g is not None)
    for name, g, w in zip('q k v la lb'.split(), got, grads):
        if w is None:
            continue
        assert torch.isfinite(g).all(), name
        error = ((g.float() - w).norm() / scale).item()
        assert error <= 2 * TOLERANCE[dtype], (name, error)


def unnormalized_past_float16(op, case, dtype):
    """The decomposed attention's output is the unnormalized sum of scores times v: at scores of 1e5 it is itself
    past float16's range (it is finite in bfloat16 and float32)."""
    return op == 'ppma_decomposed_attention' and case == 'scores-1e5' and dtype == torch.float16


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('op', OPS)
def test_half_precision_on_cpu(op, case, monkeypatch):
    monkeypatch.delenv(devices.SIMULATE_VAR, raising=False)
    for dtype in DTYPES.values():
        if unnormalized_past_float16(op, case, dtype):
            out = OPS[op](*make_inputs(small(op), case, dtype), impl='torch')
            assert torch.isinf(out).any()
            continue
        check(OPS[op], make_inputs(small(op), case, dtype), dtype, 'torch')


# the kernel families on the simulated sm_90: whole attention (PPMA, and RMT's Manhattan), the line kernels
# (criss-cross, RMT's), the scan (linear attention)
SIMULATED = ('ppma_attention-release', 'manhattan_attention', 'criss_cross_attention-release',
             'rmt_criss_cross_attention', 'ppma_linear_attention')


@pytest.mark.parametrize('case', CASES)
@pytest.mark.parametrize('op', SIMULATED)
def test_half_precision_on_the_simulated_gpu(op, case, monkeypatch):
    pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
    if torch.cuda.is_available():
        pytest.skip('the simulated GPU runs CPU tensors on the interpreter (a GPU is here)')
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    for dtype in DTYPES.values():
        check(OPS[op], make_inputs(small(op), case, dtype), dtype, 'auto')


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('op', ['criss_cross_attention-release', 'rmt_criss_cross_attention',
                                'ppma_linear_attention'])
def test_the_largest_stage_one_map(op, dtype, monkeypatch):
    """Mask R-CNN's stage 1 at 800 x 1344 (200 x 336 tokens), batch 1, the torch path on CPU."""
    monkeypatch.delenv(devices.SIMULATE_VAR, raising=False)
    # the linear attention's work grows with d^2 (a d x d state per token), its numerics with the map: d = 8 for it
    d = 8 if op == 'ppma_linear_attention' else 32
    check(OPS[op], make_inputs((1, 1, 200, 336, d), 'no-decay', DTYPES[dtype]), DTYPES[dtype], 'torch')
