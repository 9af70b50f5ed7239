"""PPMLA's and PPMDA's fused Triton kernels (mmppma/ops/linear/triton_impl.py) on the interpreter against a float64
dense oracle written from the definitions with explicit loops: output and the gradients of q, k, v, both log-decays
and the normalizer's q', k', for every form, odd sizes, 1 x N and N x 1 maps, ties and extreme decays."""
import pytest
import torch

from mmppma import ops

from .oracle import inputs, masked_linear, out_and_grads

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')

from mmppma.ops.triton_support import launch as lp  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


DECAYS = {
    'random': lambda la: la,
    'zero': lambda la: torch.zeros_like(la),  # ties in every cumulative sum
    'extreme': lambda la: torch.where(la < -0.5, -30.0, 0.0),
}
# (form, (B, heads, H, W), normalizer: 'self' | 'separate' (elu features) | 'identity' (no feature map, positive q,
# k, separate normalizer, as MLLA calls it) | 'none' (decomposed, identity features), decays)
CASES = [
    ('2d', (1, 2, 3, 5), 'self', 'random'),
    ('v2h', (2, 1, 4, 3), 'separate', 'random'),
    ('h2v', (1, 1, 5, 2), 'self', 'zero'),
    ('2d', (1, 1, 1, 40), 'self', 'random'),  # one row: two column chunks of the interpreter's 32
    ('v2h', (1, 1, 20, 1), 'separate', 'extreme'),  # narrow and tall: runs transposed
    ('2d', (1, 1, 3, 4), 'none', 'extreme'),
    ('h2v', (1, 2, 2, 3), 'none', 'random'),
    ('2d', (1, 2, 3, 4), 'identity', 'random'),
]


def _leaves(shape, normalizer, decays, seed):
    q, k, v, la, lb = inputs(*shape, 4, seed, torch.float32, 3)
    la, lb = DECAYS[decays](la), DECAYS[decays](lb)
    extra = list(inputs(*shape, 4, seed + 7, torch.float32)[:2]) if normalizer in ('separate', 'identity') else []
    if normalizer == 'identity':
        q, k, *extra = (t.abs() for t in (q, k, *extra))
    return [t.to(DEVICE).requires_grad_() for t in (q, k, v, la, lb, *extra)]


def _call(form, normalizer):
    def call(q, k, v, la, lb, *rest, impl):
        if normalizer == 'none':
            return ops.ppma_decomposed_attention(q, k, v, la, lb, form=form, impl=impl)
        extra = dict(normalizer=tuple(rest)) if rest else {}
        return ops.ppma_linear_attention(q, k, v, la, lb, form=form, feature_map=None if normalizer == 'identity'
                                         else 'elu', normalize=True, impl=impl, **extra)
    return call


@pytest.mark.parametrize('form, shape, normalizer, decays', CASES, ids=lambda x: str(x))
def test_fused_kernels_equal_the_float64_oracle(form, shape, normalizer, decays):
    leaves = _leaves(shape, normalizer, decays, seed=sum(shape))
    call = _call(form, normalizer)
    got = out_and_grads(lambda *t: call(*t, impl='triton'), leaves)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want = out_and_grads(lambda *t: masked_linear(*t, form=form, feature='elu' if normalizer in ('self', 'separate')
                                           else 'identity',
                                           normalize=normalizer != 'none'), wide)
    names = ['out', 'q', 'k', 'v', 'la', 'lb', "q'", "k'"]
    for name, a, b in zip(names, got, want):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5 * b.abs().max().item(), msg=name)


def _recorded(shape, normalizer, dtype=torch.float32, cap=90):
    leaves = [t.detach().to('meta', dtype if i < 3 else torch.float32).requires_grad_()
              for i, t in enumerate(_leaves(shape, normalizer, 'random', 0))]
    with lp.recording(cap) as forward:
        out = _call('2d', normalizer)(*leaves, impl='triton')
    with lp.recording(cap) as backward:
        torch.autograd.grad(out, leaves, torch.empty_like(out))
    return forward, backward


@pytest.mark.parametrize('normalizer', ['self', 'separate', 'none'])
def test_one_launch_forward_and_two_backward(normalizer):
    """Forward: one launch of query programs; backward: one of query programs, one of key programs. Both paths of
    '2d' in each; the separate normalizer only where one is given."""
    forward, backward = _recorded((1, 2, 5, 7), normalizer)
    assert [(x.name, x.constexprs['USE1'], x.constexprs['USE2']) for x in forward] == [('_ppmla_fwd', True, True)]
    assert [(x.name, x.constexprs['KEYS']) for x in backward] == [('_ppmla_bwd', False), ('_ppmla_bwd', True)]
    assert {x.constexprs['SEPARATE'] for x in forward + backward} == {normalizer == 'separate'}
    assert {x.constexprs['NORMALIZE'] for x in forward + backward} == {normalizer != 'none'}


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_half_precision_products_run_on_tensor_cores(dtype):
    """Half inputs: the input tiles' products in the inputs' dtype (no PRECISION: triton's tensor-core default), the
    products with a computed float32 tile in TF32; float32 inputs follow torch's TF32 setting for both."""
    forward, backward = _recorded((1, 2, 5, 7), 'separate', dtype)
    half = 1 if dtype == torch.float16 else 2
    assert {(x.constexprs['HALF'], x.constexprs['PRECISION'], x.constexprs['WIDE']) for x in forward + backward} == {
        (half, None, 'tf32')}
    forward, backward = _recorded((1, 2, 5, 7), 'separate', torch.float32)
    assert {(x.constexprs['HALF'], x.constexprs['PRECISION']) for x in forward + backward} == {
        (0, lp.precision(torch.float32))}


def test_rows_of_17_to_32_tokens_in_half_precision_on_the_simulated_gpu(monkeypatch):
    """Rows of 20 tokens on the simulated sm_90 in float16: the backward's 32-column own tiles against 16 others
    (tools/check_kernels.py), output and gradients against float32 as test_half_precision checks them."""
    from mmppma.ops import devices

    from .test_half_precision import OPS, check, make_inputs
    if torch.cuda.is_available():
        pytest.skip('the simulated GPU runs CPU tensors on the interpreter (a GPU is here)')
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    inputs = make_inputs((1, 1, 2, 20, 4), 'decay-30', torch.float16)
    meta = [t.detach().to('meta').requires_grad_() for t in inputs]
    with lp.recording(90) as recorded:
        out = OPS['ppma_linear_attention'](*meta, impl='triton')
        torch.autograd.grad(out, meta, torch.empty_like(out))
    with lp.executed() as ran:
        check(OPS['ppma_linear_attention'], inputs, torch.float16, 'auto')
    assert {c for _, c in ran} == {lp.config('ppmla_fwd', 40, torch.float16, 90),
                                   lp.config('ppmla_bwd', 40, torch.float16, 90)}
    assert [(x.constexprs['BLOCK_M'], x.constexprs['BLOCK_N']) for x in recorded] == [(32, 32), (32, 16), (32, 16)]


@pytest.mark.parametrize('case', ['decay-30', 'scores-1e5'])
def test_decomposed_half_precision_on_the_simulated_gpu(case, monkeypatch):
    """PPMDA in bfloat16 on the simulated sm_90 at extreme decays and scores of 1e5 (float16 holds no such
    unnormalized output), against float32: the checks of test_half_precision."""
    from mmppma.ops import devices

    from .test_half_precision import OPS, check, make_inputs
    if torch.cuda.is_available():
        pytest.skip('the simulated GPU runs CPU tensors on the interpreter (a GPU is here)')
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    check(OPS['ppma_decomposed_attention'], make_inputs((1, 2, 5, 7, 16), case, torch.bfloat16), torch.bfloat16,
          'auto')


@pytest.mark.heavy
@pytest.mark.parametrize('normalize', [False, True])
def test_library_ops(normalize):
    """mmppma::linear_attention_triton and its backward as torch.library checks them (schema, fake tensors,
    autograd registration, AOT dispatch)."""
    from mmppma.ops.linear.triton_impl import linear_attention_backward_op, linear_attention_op
    from mmppma.ops.masks import decay_tables
    g = torch.Generator().manual_seed(0)
    q, k, qn, kn = (torch.rand(1, 2, 3, 5, 4, generator=g).to(DEVICE) for _ in range(4))
    v = torch.randn(1, 2, 3, 5, 3, generator=g).to(DEVICE)
    ca, cb = (t.contiguous() for t in decay_tables(*(-torch.rand(2, 1, 2, 3, 5, generator=g).to(DEVICE))))
    tensors = (q, k, v, qn, kn, ca, cb)
    options = ('2d', normalize, normalize, 1e-6, 0)
    torch.library.opcheck(linear_attention_op, (*[t.clone().requires_grad_() for t in tensors], *options))
    _, o, z = linear_attention_op(*tensors, *options)
    torch.library.opcheck(linear_attention_backward_op, (torch.randn_like(v), *tensors, o, z, *options),
                          test_utils=('test_schema', 'test_faketensor', 'test_aot_dispatch_dynamic'))
