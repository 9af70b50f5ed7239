"""path_decay_tables: the decay head and its tables in one op, against a float64 oracle written here, on the
interpreted kernels and the torch path; and the attention ops' ``tables=True``."""
import pytest
import torch

import mmppma.ops as ops

from .oracle import inputs


def oracle(x, weight, dt_bias, a_log):
    """Float64, from the definitions: per head and token, l_dir = softplus(x_head . w_dir + dt_bias) * -exp(A_log);
    Ca[i, j] = sum of la over columns 0..j of row i, Cb[i, j] = sum of lb over rows 0..i of column j."""
    b, h, w, c = x.shape
    heads, d = dt_bias.shape[0], weight.shape[1]
    xh = x.double().reshape(b, h, w, heads, d)
    z = torch.einsum('bhwnd,kd->bnhwk', xh, weight.double()) + dt_bias.double()[None, :, None, None, None]
    soft = torch.log1p(torch.exp(-z.abs())) + z.clamp_min(0)
    log_decay = soft * -torch.exp(a_log.double())[None, :, None, None, None]
    la, lb = log_decay[..., 0], log_decay[..., -1]
    ca = torch.stack([la[..., :j + 1].sum(-1) for j in range(w)], -1)
    cb = torch.stack([lb[..., :i + 1, :].sum(-2) for i in range(h)], -2)
    return ca, cb


CASES = [  # (B, H, W, heads, d, directions, x dtype)
    (2, 3, 5, 2, 4, 2, torch.float32),
    (1, 1, 7, 3, 2, 1, torch.float32),  # a 1 x N map, one decay for both directions
    (1, 6, 1, 2, 4, 2, torch.float32),  # N x 1
    (1, 3, 3, 2, 8, 2, torch.bfloat16),
]


@pytest.mark.parametrize('impl', ['triton', 'torch'])
@pytest.mark.parametrize('b, h, w, heads, d, directions, dtype', CASES)
def test_tables_and_gradients_match_the_oracle(impl, b, h, w, heads, d, directions, dtype):
    g = torch.Generator().manual_seed(b * 100 + h * 10 + w)
    x = (torch.randn(b, h, w, heads * d, generator=g) * 3).to(dtype)
    params = [torch.randn(directions, d, generator=g), torch.randn(heads, generator=g) * 4,
              torch.rand(heads, generator=g)]
    leaves = [t.clone().requires_grad_() for t in [x, *params]]
    ca, cb = ops.path_decay_tables(*leaves, impl=impl)
    assert ca.dtype == cb.dtype == torch.float32 and ca.shape == cb.shape == (b, heads, h, w)
    exact = [t.detach().double().requires_grad_() for t in [x, *params]]
    want = oracle(*exact)
    for got, ref in zip((ca, cb), want):
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)
    cotangents = [torch.randn(ca.shape, generator=g, dtype=torch.float64) for _ in range(2)]
    grads = torch.autograd.grad([ca, cb], leaves, [c.float() for c in cotangents])
    refs = torch.autograd.grad(want, exact, cotangents)
    for got, ref in zip(grads, refs):
        tol = 2e-2 if got.dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_one_table_gradient_alone():
    """Only Ca reaches the loss: Cb's gradient is zero, not missing."""
    x, w, bias, a_log = torch.randn(1, 2, 3, 8), torch.randn(2, 4), torch.randn(2), torch.rand(2)
    leaves = [t.clone().requires_grad_() for t in (x, w, bias, a_log)]
    grads = torch.autograd.grad(ops.path_decay_tables(*leaves, impl='triton')[0].sum(), leaves)
    exact = [t.double().requires_grad_() for t in (x, w, bias, a_log)]
    refs = torch.autograd.grad(oracle(*exact)[0].sum(), exact)
    for got, ref in zip(grads, refs):
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-5)


def test_bad_arguments_name_the_layout():
    x, w, bias = torch.randn(1, 2, 3, 8), torch.randn(2, 4), torch.randn(2)
    with pytest.raises(ValueError, match=r'heads \* d = 3 \* 4'):
        ops.path_decay_tables(x, w, torch.randn(3), torch.rand(3))
    with pytest.raises(ValueError, match='directions'):
        ops.path_decay_tables(x, torch.randn(3, 4), bias, torch.rand(2))
    with pytest.raises(ValueError, match=r'weight \(directions, d\)'):
        ops.path_decay_tables(x[0], w, bias, torch.rand(2))


@pytest.mark.parametrize('op', [ops.ppma_attention, ops.criss_cross_attention])
@pytest.mark.parametrize('impl', ['reference', 'torch', 'triton'])
def test_attention_takes_the_tables(op, impl):
    """``tables=True`` with (Ca, Cb) gives what the log-decays (la, lb) give."""
    q, k, v, la, lb = inputs(1, 2, 3, 5, 8, seed=4, dtype=torch.float32)
    ca, cb = ops.decay_tables(la, lb)
    want = op(q, k, v, la, lb, impl='reference')
    torch.testing.assert_close(op(q, k, v, ca, cb, tables=True, impl=impl), want, rtol=1e-4, atol=1e-5)
