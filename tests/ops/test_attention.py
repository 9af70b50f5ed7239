"""Whole, criss-cross, Manhattan and linear masked attention against the float64 loop oracle, gradients
by gradcheck, half precision and extreme decays."""
from functools import partial

import numpy as np
import pytest
import torch

import mmppma.ops.criss_cross.torch_impl as criss_cross_torch
import mmppma.ops.whole.torch_impl as whole_torch
from mmppma.ops import (
    criss_cross_attention,
    manhattan_attention,
    polyline_mask_matvec,
    ppma_attention,
    ppma_decomposed_attention,
    ppma_linear_attention,
    rmt_criss_cross_attention,
)

from . import oracle
from .test_masks_and_scans import SHAPES, decays

IMPLS = ['torch', 'reference']
FORMS = ['release', 'paper', 'v2h', 'h2v']
CRISS_CROSS = ['release', 'h2v', 'v2h']


def qkv(b, heads, h, w, d, seed=0, dtype=torch.float64, dv=None):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, heads, h, w, n, generator=g, dtype=dtype) for n in (d, d, dv or d)]


def force_blockwise(monkeypatch):
    """The torch path of whole attention on its blockwise (recomputing) branch, one image row of queries per block."""
    monkeypatch.setattr(whole_torch, 'SMALL_ELEMENTS', 0)
    monkeypatch.setattr(whole_torch, 'BLOCK_ELEMENTS', 1)


@pytest.fixture(params=['plain', 'blockwise'])
def whole_path(request, monkeypatch):
    """Run a test on both branches of the torch path of whole attention."""
    if request.param == 'blockwise':
        force_blockwise(monkeypatch)


def _leaf(*ts):
    return [t.clone().requires_grad_() for t in ts]


def oracle_cases(q, k, v, la, lb, gamma):
    """(name, op(q, k, v, **options), the oracle's output) for every whole-attention form, every criss-cross form,
    RMT's Manhattan attention and its decomposed (criss-cross) form; gamma per head or per image and head."""
    b, heads, h, w = la.shape
    arrays = [t.numpy() for t in (q, k, v)]
    cases = [(f'whole {form}', lambda *t, form=form, **kw: ppma_attention(*t, la, lb, scale=0.5, form=form, **kw),
              oracle.apply_per_head(oracle.whole_attention, *arrays, la.numpy(), lb.numpy(), scale=0.5, form=form))
             for form in FORMS]
    cases += [(f'criss_cross {form}',
               lambda *t, form=form, **kw: criss_cross_attention(*t, la, lb, scale=0.7, form=form, **kw),
               oracle.apply_per_head(oracle.criss_cross, *arrays, la.numpy(), lb.numpy(), scale=0.7, form=form))
              for form in CRISS_CROSS]
    gamma_bh = torch.broadcast_to(gamma, (b, heads))
    g = gamma_bh[:, :, None, None].expand(b, heads, h, w).numpy()
    # decomposed RMT = polyline criss-cross with constant decays, rows first
    cases.append(('rmt_criss_cross', lambda *t, **kw: rmt_criss_cross_attention(*t, gamma, scale=0.5, **kw),
                  oracle.apply_per_head(oracle.criss_cross, *arrays, g, g, scale=0.5, form='h2v')))
    masks = np.stack([np.stack([oracle.manhattan_mask(gamma_bh[bi, n].item(), h, w) for n in range(heads)])
                      for bi in range(b)])
    qf, kf, vf = (a.reshape(b, heads, h * w, -1) for a in arrays)
    scores = 0.5 * np.einsum('bnid,bnjd->bnij', qf, kf)
    cases.append(('manhattan', lambda *t, **kw: manhattan_attention(*t, gamma, scale=0.5, **kw),
                  (oracle.softmax(scores + masks) @ vf).reshape(b, heads, h, w, -1)))
    return cases


@pytest.mark.parametrize('hw', SHAPES)
def test_attention_matches_oracle(hw):
    h, w = hw
    q, k, v = qkv(1, 2, h, w, 4, seed=h + w, dv=3)
    la, lb = decays(1, 2, h, w, seed=h * w)
    for name, op, want in oracle_cases(q, k, v, la, lb, torch.tensor([-0.1, -1.3], dtype=torch.float64)):
        for impl in IMPLS:
            np.testing.assert_allclose(op(q, k, v, impl=impl).numpy(), want, rtol=1e-10, atol=1e-12,
                                       err_msg=f'{name} {impl}')
    # linear attention ((q k^T) * L2D) v, no softmax
    want = dense_masked_linear(*(t.numpy() for t in (q, k, v, la, lb)))
    for impl in IMPLS:
        np.testing.assert_allclose(ppma_linear_attention(q, k, v, la, lb, impl=impl, chunk=4).numpy(), want,
                                   rtol=1e-9, atol=1e-11, err_msg=f'linear {impl}')


# criss-cross slices (at 4x7, 196 elements per map): one head per group, two heads of one image, one image,
# all images (and at 1x6 / 5x1 more maps per group)
@pytest.mark.parametrize('slice_elements', [1, 400, 600, 1 << 18])
@pytest.mark.parametrize('hw', [(1, 6), (5, 1), (4, 7)])
def test_inference_and_autograd_paths_match_oracle(hw, slice_elements, monkeypatch):
    """Without autograd the torch path takes its inference branches (blockwise whole attention, criss-cross
    per group of (image, head) maps), with it the autograd ones, and then the blockwise (recomputing) branch of
    whole attention when forced: all equal the oracle, with a decay per image and head (the reference too)."""
    monkeypatch.setattr(criss_cross_torch, 'SLICE_ELEMENTS', slice_elements)
    h, w = hw
    q, k, v = qkv(2, 3, h, w, 4, seed=h + w, dv=5)
    la, lb = decays(2, 3, h, w, seed=h * w)
    gamma = torch.tensor([[-0.1, -0.5, -1.3], [-0.7, -0.2, -2.0]], dtype=torch.float64)
    cases = oracle_cases(q, k, v, la, lb, gamma)
    for name, op, want in cases:
        np.testing.assert_allclose(op(q, k, v, impl='reference').numpy(), want, rtol=1e-10, atol=1e-12, err_msg=name)
        with torch.no_grad():
            np.testing.assert_allclose(op(q, k, v).numpy(), want, rtol=1e-10, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(op(*_leaf(q, k, v)).detach().numpy(), want, rtol=1e-10, atol=1e-12, err_msg=name)
    force_blockwise(monkeypatch)
    for name, op, want in cases:
        np.testing.assert_allclose(op(*_leaf(q, k, v)).detach().numpy(), want, rtol=1e-10, atol=1e-12, err_msg=name)


def dense_masked_linear(q, k, v, la, lb, mask='2d'):
    """((q k^T) * L) v with the oracle's dense L, per batch item and head."""
    def one(q, k, v, la, lb):
        h, w, _ = q.shape
        m = oracle.mask_v2h(la, lb)
        lmask = {'2d': np.exp(m) + np.exp(m.T), 'v2h': np.exp(m), 'h2v': np.exp(m.T)}[mask]
        qf, kf, vf = q.reshape(h * w, -1), k.reshape(h * w, -1), v.reshape(h * w, -1)
        return (((qf @ kf.T) * lmask) @ vf).reshape(h, w, -1)
    return oracle.apply_per_head(one, q, k, v, la, lb)


@pytest.mark.parametrize('form', ['2d', 'v2h', 'h2v'])
def test_decomposed_attention_and_feature_maps(form):
    q, k, v = qkv(2, 2, 5, 6, 3, seed=4, dv=4)
    la, lb = decays(2, 2, 5, 6, seed=5)
    ones = np.ones_like(v.numpy()[..., :1])

    def dense(fq, fk, x):
        return dense_masked_linear(fq.numpy(), fk.numpy(), x, la.numpy(), lb.numpy(), form)

    s1, s2 = q.softmax(-1), k.softmax(-1)  # e.g. agent-style low-rank factors
    got = ppma_decomposed_attention(s1, s2, v, la, lb, form=form, impl='torch', chunk=2)
    np.testing.assert_allclose(got.numpy(), dense(s1, s2, v.numpy()), rtol=1e-9, atol=1e-11)
    # normalized elu+1 linear attention: rows of the masked map sum to one after normalization
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    num = dense(fq, fk, v.numpy())
    got = ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True, eps=0.0, form=form)
    np.testing.assert_allclose(got.numpy(), num / dense(fq, fk, ones), rtol=1e-9)
    # the mass from other features (MLLA: the un-rotated ones), the numerator from q, k
    nq, nk = qkv(2, 2, 5, 6, 3, seed=6)[:2]
    den2 = dense(torch.nn.functional.elu(nq) + 1, torch.nn.functional.elu(nk) + 1, ones)
    got = ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True, eps=0.0, form=form,
                                normalizer=(nq, nk))
    np.testing.assert_allclose(got.numpy(), num / den2, rtol=1e-9)


# ---------------------------------------------------------------------------------------------- gradients
GAMMA = torch.tensor([-0.3, -0.6], dtype=torch.float64)
# name: (op, (h, w, d, seed) of the inputs, which of q, k, v, la, lb it takes, fast_mode, depends on the branch
# of whole attention); fast mode checks random projections of the Jacobian: every input's gradient is still
# exercised. chunk=2 runs the chunkwise scan on the length-3 and length-5 lines.
GRADCHECKS = {
    **{f'whole {form} {impl}': (partial(ppma_attention, scale=0.8, form=form, impl=impl), (3, 4, 2, 3), 'qkvab',
                                True, impl == 'torch') for form in FORMS for impl in IMPLS},
    **{f'criss_cross {form} {impl}': (partial(criss_cross_attention, scale=0.8, form=form, impl=impl), (3, 5, 3, 3),
                                      'qkvab', False, False) for form in ('release', 'h2v') for impl in IMPLS},
    'manhattan': (lambda *a: manhattan_attention(*a, GAMMA, impl='torch'), (3, 4, 3, 3), 'qkv', False, True),
    'rmt_criss_cross': (lambda *a: rmt_criss_cross_attention(*a, GAMMA, impl='torch'), (3, 4, 3, 3), 'qkv', False,
                        False),
    'linear': (partial(ppma_linear_attention, impl='torch', chunk=2), (3, 4, 3, 3), 'qkvab', True, False),
    **{f'matvec {form}': (partial(polyline_mask_matvec, form=form, chunk=2, impl='torch'), (3, 5, 2, 6), 'vab', False,
                          False) for form in ('v2h', 'h2v')},
    **{f'decomposed {form}': (partial(ppma_decomposed_attention, form=form, impl='torch', chunk=2), (3, 5, 2, 6),
                              'qkvab', True, False) for form in ('v2h', 'h2v')},
}


@pytest.mark.parametrize('name, blockwise', [(name, False) for name in GRADCHECKS] +
                         [(name, True) for name, case in GRADCHECKS.items() if case[-1]])
def test_gradcheck(name, blockwise, monkeypatch):
    op, (h, w, d, seed), takes, fast, _ = GRADCHECKS[name]
    if blockwise:
        force_blockwise(monkeypatch)
    inputs = dict(zip('qkvab', [*qkv(1, 2, h, w, d, seed=seed), *decays(1, 2, h, w, seed=seed + 1)]))
    assert torch.autograd.gradcheck(op, _leaf(*(inputs[c] for c in takes)), fast_mode=fast)


@pytest.mark.parametrize('op', [ppma_attention, manhattan_attention], ids=['ppma', 'manhattan'])
def test_torch_and_reference_agree_on_a_larger_map(op, whole_path):
    """Outputs and every input gradient (decay tables included)."""
    q, k, v = qkv(2, 2, 6, 9, 4, seed=8)
    leaves = [q, k, v, *decays(2, 2, 6, 9, seed=9)] if op is ppma_attention else [q, k, v, GAMMA.clone()]
    results = []
    for impl in IMPLS:
        xs = _leaf(*leaves)
        out = op(*xs, scale=0.5, impl=impl)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
        results.append([out.detach()] + [t.grad for t in xs])
    for a, b in zip(*results):
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
