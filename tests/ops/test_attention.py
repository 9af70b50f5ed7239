"""Whole, criss-cross, Manhattan and linear masked attention against the float64 loop oracle, gradients
by gradcheck, half precision, extreme decays and input validation."""
import numpy as np
import pytest
import torch

import mmppma.ops.attention as attention_module
from mmppma.ops import (
    criss_cross_attention,
    manhattan_attention,
    ppma_attention,
    ppma_decomposed_attention,
    ppma_linear_attention,
    rmt_criss_cross_attention,
)

from . import oracle
from .test_masks_and_scans import SHAPES, decays

IMPLS = ['torch', 'reference']


def qkv(b, heads, h, w, d, seed=0, dtype=torch.float64, dv=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, h, w, d, generator=g, dtype=dtype)
    k = torch.randn(b, heads, h, w, d, generator=g, dtype=dtype)
    v = torch.randn(b, heads, h, w, dv or d, generator=g, dtype=dtype)
    return q, k, v


@pytest.fixture
def small_blocks(monkeypatch):
    """Force the torch path of whole attention onto its blockwise (recomputing) branch, one image row
    of queries per block."""
    monkeypatch.setattr(attention_module, 'SMALL_ELEMENTS', 0)
    monkeypatch.setattr(attention_module, 'BLOCK_ELEMENTS', 1)


@pytest.fixture(params=['plain', 'blockwise'])
def whole_path(request, monkeypatch):
    """Run a test on both branches of the torch path of whole attention."""
    if request.param == 'blockwise':
        monkeypatch.setattr(attention_module, 'SMALL_ELEMENTS', 0)
        monkeypatch.setattr(attention_module, 'BLOCK_ELEMENTS', 1)
    return request.param


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('form', ['release', 'paper', 'v2h', 'h2v'])
@pytest.mark.parametrize('hw', SHAPES)
def test_whole_attention_matches_oracle(hw, form, impl):
    h, w = hw
    q, k, v = qkv(1, 2, h, w, 4, seed=h + w, dv=3)
    la, lb = decays(1, 2, h, w, seed=h * w)
    got = ppma_attention(q, k, v, la, lb, scale=0.5, form=form, impl=impl)
    want = oracle.apply_per_head(oracle.whole_attention, q.numpy(), k.numpy(), v.numpy(), la.numpy(),
                                 lb.numpy(), scale=0.5, form=form)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_whole_attention_blockwise_matches_oracle(small_blocks):
    q, k, v = qkv(2, 2, 5, 7, 4, seed=1)
    la, lb = decays(2, 2, 5, 7, seed=2)
    want = oracle.apply_per_head(oracle.whole_attention, q.numpy(), k.numpy(), v.numpy(), la.numpy(),
                                 lb.numpy(), scale=1.0, form='release')
    np.testing.assert_allclose(ppma_attention(q, k, v, la, lb, impl='torch').numpy(), want, rtol=1e-10)


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('form,order', [('release', 'both'), ('h2v', 'row_col'), ('v2h', 'col_row')])
@pytest.mark.parametrize('hw', SHAPES)
def test_criss_cross_matches_oracle(hw, form, order, impl):
    h, w = hw
    q, k, v = qkv(1, 2, h, w, 4, seed=h * 3 + w, dv=5)
    la, lb = decays(1, 2, h, w, seed=h + 2 * w)
    got = criss_cross_attention(q, k, v, la, lb, scale=0.7, form=form, impl=impl)
    want = oracle.apply_per_head(oracle.criss_cross, q.numpy(), k.numpy(), v.numpy(), la.numpy(),
                                 lb.numpy(), scale=0.7, order=order)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('hw', [(1, 9), (7, 7), (13, 17)])
def test_rmt_attention_matches_oracle(hw, impl):
    h, w = hw
    q, k, v = qkv(2, 3, h, w, 4, seed=5)
    gamma = torch.tensor([-0.1, -0.5, -1.3], dtype=torch.float64)
    got = manhattan_attention(q, k, v, gamma, scale=0.5, impl=impl).numpy()
    for b in range(2):
        for hi in range(3):
            qf, kf, vf = (t[b, hi].reshape(h * w, -1).numpy() for t in (q, k, v))
            m = oracle.manhattan_mask(gamma[hi].item(), h, w)
            want = oracle.softmax(0.5 * qf @ kf.T + m) @ vf
            np.testing.assert_allclose(got[b, hi].reshape(h * w, -1), want, rtol=1e-10, atol=1e-12)
    # decomposed RMT = polyline criss-cross with constant decays, rows first
    g = gamma[None, :, None, None].expand(2, 3, h, w)
    want_cc = oracle.apply_per_head(oracle.criss_cross, q.numpy(), k.numpy(), v.numpy(), g.numpy(), g.numpy(),
                                    scale=0.5, order='row_col')
    np.testing.assert_allclose(rmt_criss_cross_attention(q, k, v, gamma, scale=0.5, impl=impl).numpy(), want_cc,
                               rtol=1e-10, atol=1e-12)


def test_per_sample_manhattan_decay():
    q, k, v = qkv(2, 2, 3, 4, 4)
    gamma = torch.tensor([[-0.2, -0.4], [-1.0, -2.0]], dtype=torch.float64)
    torch.testing.assert_close(manhattan_attention(q, k, v, gamma, impl='torch'),
                               manhattan_attention(q, k, v, gamma, impl='reference'))


# criss-cross slices (at 4x7, 196 elements per map): one head per group, two heads of one image, one image,
# all images (and at 1x6 / 5x1 more maps per group)
@pytest.mark.parametrize('slice_elements', [1, 400, 600, 1 << 18])
@pytest.mark.parametrize('hw', [(1, 6), (5, 1), (4, 7)])
def test_inference_and_autograd_paths_match_oracle(hw, slice_elements, monkeypatch):
    """Without autograd the torch path takes its inference branches (blockwise whole attention, criss-cross
    per group of (image, head) maps), with it the autograd ones: both equal the oracle."""
    monkeypatch.setattr(attention_module, 'SLICE_ELEMENTS', slice_elements)
    h, w = hw
    q, k, v = qkv(2, 3, h, w, 4, seed=h + w, dv=5)
    la, lb = decays(2, 3, h, w, seed=h * w)
    gamma = torch.tensor([[-0.1, -0.5, -1.3], [-0.7, -0.2, -2.0]], dtype=torch.float64)  # per image and head
    g = gamma[:, :, None, None].expand(2, 3, h, w)
    arrays = [t.numpy() for t in (q, k, v)]
    cases = [(lambda *t: ppma_attention(*t, la, lb, scale=0.5), oracle.apply_per_head(
        oracle.whole_attention, *arrays, la.numpy(), lb.numpy(), scale=0.5, form='release'))]
    for form, order in (('release', 'both'), ('h2v', 'row_col'), ('v2h', 'col_row')):
        cases.append((lambda *t, form=form: criss_cross_attention(*t, la, lb, scale=0.7, form=form),
                      oracle.apply_per_head(oracle.criss_cross, *arrays, la.numpy(), lb.numpy(), scale=0.7,
                                            order=order)))
    cases.append((lambda *t: rmt_criss_cross_attention(*t, gamma, scale=0.5), oracle.apply_per_head(
        oracle.criss_cross, *arrays, g.numpy(), g.numpy(), scale=0.5, order='row_col')))
    manhattan = np.stack([np.stack([oracle.manhattan_mask(gamma[b, n].item(), h, w) for n in range(3)])
                          for b in range(2)])
    scores = 0.5 * np.einsum('bnid,bnjd->bnij', arrays[0].reshape(2, 3, h * w, 4), arrays[1].reshape(2, 3, h * w, 4))
    cases.append((lambda *t: manhattan_attention(*t, gamma, scale=0.5),
                  (oracle.softmax(scores + manhattan) @ arrays[2].reshape(2, 3, h * w, 5)).reshape(2, 3, h, w, 5)))
    for op, want in cases:
        with torch.no_grad():
            np.testing.assert_allclose(op(q, k, v).numpy(), want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(op(*_leaf(q, k, v)).detach().numpy(), want, rtol=1e-10, atol=1e-12)


def dense_masked_linear(q, k, v, la, lb, mask='2d'):
    """((q k^T) * L) v with the oracle's dense L, per batch item and head."""
    def one(q, k, v, la, lb):
        h, w, _ = q.shape
        m = oracle.mask_v2h(la, lb)
        lmask = {'2d': np.exp(m) + np.exp(m.T), 'v2h': np.exp(m), 'h2v': np.exp(m.T)}[mask]
        qf, kf, vf = q.reshape(h * w, -1), k.reshape(h * w, -1), v.reshape(h * w, -1)
        return (((qf @ kf.T) * lmask) @ vf).reshape(h, w, -1)
    return oracle.apply_per_head(one, q, k, v, la, lb)


@pytest.mark.parametrize('impl', IMPLS)
@pytest.mark.parametrize('hw', SHAPES)
def test_linear_attention_equals_dense_masked_linear_attention(hw, impl):
    h, w = hw
    q, k, v = qkv(1, 2, h, w, 3, seed=9, dv=2)
    la, lb = decays(1, 2, h, w, seed=11)
    want = dense_masked_linear(q.numpy(), k.numpy(), v.numpy(), la.numpy(), lb.numpy())
    got = ppma_linear_attention(q, k, v, la, lb, impl=impl, chunk=4)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize('form', ['2d', 'v2h', 'h2v'])
def test_decomposed_attention_and_feature_maps(form):
    q, k, v = qkv(2, 2, 5, 6, 3, seed=4, dv=4)
    la, lb = decays(2, 2, 5, 6, seed=5)
    s1, s2 = q.softmax(-1), k.softmax(-1)  # e.g. agent-style low-rank factors
    want = dense_masked_linear(s1.numpy(), s2.numpy(), v.numpy(), la.numpy(), lb.numpy(), form)
    got = ppma_decomposed_attention(s1, s2, v, la, lb, form=form, impl='torch', chunk=2)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-11)
    # normalized elu+1 linear attention: rows of the masked map sum to one after normalization
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    num = dense_masked_linear(fq.numpy(), fk.numpy(), v.numpy(), la.numpy(), lb.numpy(), form)
    den = dense_masked_linear(fq.numpy(), fk.numpy(), np.ones_like(v.numpy()[..., :1]), la.numpy(), lb.numpy(),
                              form)
    got = ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True, eps=0.0, form=form)
    np.testing.assert_allclose(got.numpy(), num / den, rtol=1e-9)
    # the mass from other features (MLLA: the un-rotated ones), the numerator from q, k
    nq, nk = qkv(2, 2, 5, 6, 3, seed=6)[:2]
    fnq, fnk = torch.nn.functional.elu(nq) + 1, torch.nn.functional.elu(nk) + 1
    den2 = dense_masked_linear(fnq.numpy(), fnk.numpy(), np.ones_like(v.numpy()[..., :1]), la.numpy(),
                               lb.numpy(), form)
    got = ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True, eps=0.0, form=form,
                                normalizer=(nq, nk))
    np.testing.assert_allclose(got.numpy(), num / den2, rtol=1e-9)
    with pytest.raises(ValueError, match='normalize=True'):
        ppma_linear_attention(q, k, v, la, lb, normalizer=(nq, nk))
    with pytest.raises(ValueError, match='shaped like q'):
        ppma_linear_attention(q, k, v, la, lb, normalize=True, normalizer=(nq[:, :1], nk))


# ---------------------------------------------------------------------------------------------- gradients
def _leaf(*ts):
    return [t.clone().requires_grad_() for t in ts]


@pytest.mark.parametrize('form', ['release', 'v2h', 'h2v', 'paper'])
def test_whole_attention_gradcheck(form, whole_path):
    q, k, v = qkv(1, 2, 3, 4, 2, seed=3)
    la, lb = decays(1, 2, 3, 4, seed=4)
    for impl in IMPLS:
        # fast mode checks random projections of the Jacobian: every input's gradient is still exercised
        assert torch.autograd.gradcheck(lambda *a: ppma_attention(*a, scale=0.8, form=form, impl=impl),
                                        _leaf(q, k, v, la, lb), fast_mode=True)


@pytest.mark.parametrize('form', ['release', 'h2v'])
def test_criss_cross_gradcheck(form):
    q, k, v = qkv(1, 2, 3, 5, 3, seed=3)
    la, lb = decays(1, 2, 3, 5, seed=4)
    for impl in IMPLS:
        assert torch.autograd.gradcheck(lambda *a: criss_cross_attention(*a, scale=0.8, form=form, impl=impl),
                                        _leaf(q, k, v, la, lb))


def test_rmt_and_linear_gradcheck(whole_path):
    q, k, v = qkv(1, 2, 3, 4, 3, seed=3)
    la, lb = decays(1, 2, 3, 4, seed=4)
    gamma = torch.tensor([-0.3, -0.6], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *a: manhattan_attention(*a, gamma, impl='torch'), _leaf(q, k, v))
    assert torch.autograd.gradcheck(lambda *a: rmt_criss_cross_attention(*a, gamma, impl='torch'), _leaf(q, k, v))
    assert torch.autograd.gradcheck(lambda *a: ppma_linear_attention(*a, impl='torch', chunk=2),
                                    _leaf(q, k, v, la, lb), fast_mode=True)


def test_torch_and_reference_gradients_agree_on_a_larger_map(whole_path):
    q, k, v = qkv(2, 2, 6, 9, 4, seed=8)
    la, lb = decays(2, 2, 6, 9, seed=9)
    grads = {}
    for impl in IMPLS:
        leaves = _leaf(q, k, v, la, lb)
        out = ppma_attention(*leaves, scale=0.5, impl=impl)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        grads[impl] = [t.grad for t in leaves]
    for a, b in zip(*grads.values()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------- precision and range
OPS = {
    'whole': lambda q, k, v, la, lb: ppma_attention(q, k, v, la, lb, scale=q.shape[-1]**-0.5),
    'criss_cross': lambda q, k, v, la, lb: criss_cross_attention(q, k, v, la, lb, scale=q.shape[-1]**-0.5),
    'linear': lambda q, k, v, la, lb: ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True),
}


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('op', sorted(OPS))
def test_half_inputs_are_finite_and_close_to_float32(op, dtype, whole_path):
    q, k, v = qkv(2, 2, 7, 9, 16, seed=1, dtype=torch.float32)
    la, lb = decays(2, 2, 7, 9, seed=2, dtype=torch.float32)
    want = OPS[op](q, k, v, la, lb)
    got = OPS[op](q.to(dtype), k.to(dtype), v.to(dtype), la.to(dtype), lb.to(dtype))
    assert got.dtype == dtype and torch.isfinite(got).all()
    rel = (got.float() - want).norm() / want.norm()
    assert rel < 2e-2, f'{op} {dtype}: relative error {rel:.3g}'


@pytest.mark.parametrize('op', sorted(OPS))
@pytest.mark.parametrize('hw', [(1, 1), (1, 9), (9, 1), (13, 17)])
def test_extreme_decays_give_finite_values_and_gradients(op, hw, whole_path):
    h, w = hw
    q, k, v = qkv(1, 2, h, w, 4, dtype=torch.float32)
    la, lb = decays(1, 2, h, w, offset=1e4, dtype=torch.float32)
    leaves = _leaf(q, k, v, la, lb)
    out = OPS[op](*leaves)
    out.sum().backward()
    assert torch.isfinite(out).all()
    with torch.no_grad():  # the inference paths
        torch.testing.assert_close(OPS[op](q, k, v, la, lb), out.detach())
    for t in leaves:
        assert torch.isfinite(t.grad).all()
    if op == 'whole':  # nothing but the token itself survives such a mask
        torch.testing.assert_close(out, v)


# -------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize('fn', [ppma_attention, criss_cross_attention])
def test_wrong_shapes_name_the_expected_layout(fn):
    q, k, v = qkv(1, 2, 3, 4, 5)
    la, lb = decays(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r'q, k: \(B, heads, H, W, d\)'):
        fn(q, k[..., :4], v, la, lb)
    with pytest.raises(ValueError, match=r'la \(horizontal\), lb \(vertical\) log-decays: \(B, heads, H, W\)'):
        fn(q, k, v, la[..., :3], lb)
    with pytest.raises(ValueError, match=r'\(B, heads, H, W, d\)'):
        fn(q[0], k[0], v[0], la[0], lb[0])
    with pytest.raises(ValueError, match='form'):
        fn(q, k, v, la, lb, form='x')


def test_integer_inputs_are_rejected():
    q, k, v = qkv(1, 1, 2, 2, 2)
    la, lb = decays(1, 1, 2, 2)
    with pytest.raises(ValueError, match='floating point'):
        ppma_attention(q.long(), k, v, la, lb)


def test_linear_attention_shape_error():
    q, k, v = qkv(1, 2, 3, 4, 5)
    la, lb = decays(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r'\(B, heads, H, W, r\)'):
        ppma_linear_attention(q, k[:, :1], v, la, lb)


@pytest.mark.parametrize('form', ['v2h', 'h2v'])
def test_matvec_and_decomposed_gradcheck(form):
    from mmppma.ops import polyline_mask_matvec
    q, k, v = qkv(1, 2, 3, 5, 2, seed=6)
    la, lb = decays(1, 2, 3, 5, seed=7)
    # chunk=2 runs the chunkwise scan on the length-3 and length-5 lines
    assert torch.autograd.gradcheck(lambda x, a, b: polyline_mask_matvec(x, a, b, form=form, chunk=2, impl='torch'),
                                    _leaf(v, la, lb))
    assert torch.autograd.gradcheck(
        lambda *a: ppma_decomposed_attention(*a, form=form, impl='torch', chunk=2), _leaf(q, k, v, la, lb),
        fast_mode=True)
