"""Whole, criss-cross, Manhattan and linear masked attention against the float64 loop oracle on every torch
branch, gradients by gradcheck, half precision and extreme decays."""
from functools import partial

import numpy as np
import pytest
import torch

import mmppma.ops.criss_cross.torch_impl as criss_cross_torch
import mmppma.ops.whole.torch_impl as whole_torch
from mmppma import ops
from mmppma.ops.export import ExportTarget

from . import oracle
from .oracle import decays, inputs, leaf, out_and_grads, qkv
from .test_masks_and_scans import SHAPES

IMPLS = ['torch', 'reference']
FORMS = ['release', 'paper', 'v2h', 'h2v']
CLOSE = dict(rtol=1e-10, atol=1e-12)


def force_blockwise(monkeypatch, block_elements=1):
    """Whole attention's torch path on its blockwise (recomputing) branch, by default one image row per block."""
    monkeypatch.setattr(whole_torch, 'SMALL_ELEMENTS', 0)
    monkeypatch.setattr(whole_torch, 'BLOCK_ELEMENTS', block_elements)


@pytest.fixture(params=['plain', 'blockwise'])
def whole_path(request, monkeypatch):
    if request.param == 'blockwise':
        force_blockwise(monkeypatch)


def oracle_cases(q, k, v, la, lb, log_decay):
    """(name, op(q, k, v, **options), the oracle's output) for every softmax attention and form."""
    b, heads, h, w = la.shape
    arrays = [t.numpy() for t in (q, k, v)]
    per_head = torch.broadcast_to(log_decay, (b, heads))
    constant = per_head[:, :, None, None].expand(b, heads, h, w).numpy()
    masks = np.stack([np.stack([oracle.manhattan_mask(x.item(), h, w) for x in row]) for row in per_head])
    qf, kf, vf = (a.reshape(b, heads, h * w, -1) for a in arrays)
    return [*[(f'whole {form}', lambda *t, form=form, **kw: ops.ppma_attention(*t, la, lb, scale=0.5, form=form, **kw),
               oracle.apply_per_head(oracle.whole_attention, *arrays, la.numpy(), lb.numpy(), scale=0.5, form=form))
              for form in FORMS],
            *[(f'criss_cross {form}',
               lambda *t, form=form, **kw: ops.criss_cross_attention(*t, la, lb, scale=0.7, form=form, **kw),
               oracle.apply_per_head(oracle.criss_cross, *arrays, la.numpy(), lb.numpy(), scale=0.7, form=form))
              for form in ('release', 'h2v', 'v2h')],
            # RMT's decomposed attention is criss-cross attention with constant decays, rows first
            ('rmt_criss_cross', lambda *t, **kw: ops.rmt_criss_cross_attention(*t, log_decay, scale=0.5, **kw),
             oracle.apply_per_head(oracle.criss_cross, *arrays, constant, constant, scale=0.5, form='h2v')),
            ('manhattan', lambda *t, **kw: ops.manhattan_attention(*t, log_decay, scale=0.5, **kw),
             (oracle.softmax(0.5 * np.einsum('bnid,bnjd->bnij', qf, kf) + masks) @ vf).reshape(b, heads, h, w, -1))]


def dense_masked_linear(q, k, v, la, lb, form='2d'):
    """((q k^T) * L) v with the oracle's dense L, per batch item and head."""
    def one(q, k, v, la, lb):
        h, w, _ = q.shape
        m = oracle.mask_v2h(la, lb)
        lmask = {'2d': np.exp(m) + np.exp(m.T), 'v2h': np.exp(m), 'h2v': np.exp(m.T)}[form]
        return (((q.reshape(h * w, -1) @ k.reshape(h * w, -1).T) * lmask) @ v.reshape(h * w, -1)).reshape(h, w, -1)
    return oracle.apply_per_head(one, q, k, v, la, lb)


@pytest.mark.parametrize('hw', SHAPES)
def test_attention_matches_oracle(hw):
    h, w = hw
    q, k, v = qkv(1, 2, h, w, 4, seed=h + w, dv=3)
    la, lb = decays(1, 2, h, w, seed=h * w)
    for name, op, want in oracle_cases(q, k, v, la, lb, torch.tensor([-0.1, -1.3], dtype=torch.float64)):
        for impl in IMPLS:
            np.testing.assert_allclose(op(q, k, v, impl=impl).numpy(), want, **CLOSE, err_msg=f'{name} {impl}')
    want = dense_masked_linear(*(t.numpy() for t in (q, k, v, la, lb)))  # ((q k^T) * L2D) v, no softmax
    for impl in IMPLS:
        np.testing.assert_allclose(ops.ppma_linear_attention(q, k, v, la, lb, impl=impl, chunk=4).numpy(), want,
                                   rtol=1e-9, atol=1e-11, err_msg=f'linear {impl}')


# criss-cross slices at 4x7 (196 elements per map): one head per group, two heads of one image, one image, all
# images (and at 1x6 / 5x1 more maps per group)
@pytest.mark.parametrize('slice_elements', [1, 400, 600, 1 << 18])
@pytest.mark.parametrize('hw', [(1, 6), (5, 1), (4, 7)])
def test_inference_and_autograd_paths_match_oracle(hw, slice_elements, monkeypatch):
    """Without autograd the inference branches, with it the autograd ones and whole attention's blockwise one."""
    monkeypatch.setattr(criss_cross_torch, 'SLICE_ELEMENTS', slice_elements)
    q, k, v = qkv(2, 3, *hw, 4, seed=sum(hw), dv=5)
    la, lb = decays(2, 3, *hw, seed=hw[0] * hw[1])
    log_decay = torch.tensor([[-0.1, -0.5, -1.3], [-0.7, -0.2, -2.0]], dtype=torch.float64)
    cases = oracle_cases(q, k, v, la, lb, log_decay)
    for name, op, want in cases:
        np.testing.assert_allclose(op(q, k, v, impl='reference').numpy(), want, **CLOSE, err_msg=name)
        with torch.no_grad():
            np.testing.assert_allclose(op(q, k, v).numpy(), want, **CLOSE, err_msg=name)
        np.testing.assert_allclose(op(*leaf(q, k, v)).detach().numpy(), want, **CLOSE, err_msg=name)
    force_blockwise(monkeypatch)
    for name, op, want in cases:
        np.testing.assert_allclose(op(*leaf(q, k, v)).detach().numpy(), want, **CLOSE, err_msg=name)


@pytest.mark.parametrize('loops', [True, False])
@pytest.mark.parametrize('hw', [(1, 6), (5, 1), (4, 7)])
def test_export_forms_match_oracle(hw, loops):
    """The forms an export traces (:func:`mmppma.ops.export_mode`), run eagerly, against the oracle: above the
    loop thresholds whole attention row by row per head and criss-cross attention line by line, below them the
    one-shot forms."""
    target = ExportTarget('test', loop_tokens={op: 0 if loops else 99 for op in ('whole', 'criss_cross')})
    q, k, v = qkv(2, 3, *hw, 4, seed=sum(hw) + 1, dv=5)
    la, lb = decays(2, 3, *hw, seed=hw[0] * hw[1] + 1)
    log_decay = torch.tensor([[-0.1, -0.5, -1.3], [-0.7, -0.2, -2.0]], dtype=torch.float64)
    assert ops.whole_attention_branch(2, 3, *hw, form='release', grad=False) == 'inference'
    with ops.export_mode(target):
        assert ops.export_target() is target
        assert ops.whole_attention_branch(2, 3, *hw, form='release', grad=False) == ('export' if loops else 'autograd')
        for name, op, want in oracle_cases(q, k, v, la, lb, log_decay):
            np.testing.assert_allclose(op(q, k, v, impl='torch').numpy(), want, **CLOSE, err_msg=name)


def test_an_export_target_names_its_ops_and_a_bad_value():
    with pytest.raises(ValueError, match=r"loop_tokens has no op \['wholes'\]; the ops are \('whole', 'criss_cross'\)"):
        ExportTarget('x', loop_tokens=dict(wholes=10))
    with pytest.raises(ValueError, match='opset must be a positive int'):
        ExportTarget('x', opset=0)
    with pytest.raises(TypeError, match='target must be an ExportTarget'):
        with ops.export_mode('onnxruntime'):
            pass
    target = ExportTarget('x', loop_tokens=dict(whole=10))
    assert [target.loops('whole', n) for n in (10, 11)] == [False, True]
    assert not target.loops('criss_cross', 10**6)  # no threshold: one-shot at every fixed size
    assert target.loops('criss_cross', object())  # a traced size (not an int): the file serves every size
    with ops.export_mode():  # no target: no runtime's choices
        assert ops.export_target().loop_tokens == {} and ops.export_target().opset is None
    assert not ops.exporting()


@pytest.mark.parametrize('form', ['2d', 'v2h', 'h2v'])
def test_decomposed_attention_and_feature_maps(form):
    q, k, v = qkv(2, 2, 5, 6, 3, seed=4, dv=4)
    la, lb = decays(2, 2, 5, 6, seed=5)
    ones = np.ones_like(v.numpy()[..., :1])

    def dense(fq, fk, x):
        return dense_masked_linear(fq.numpy(), fk.numpy(), x, la.numpy(), lb.numpy(), form)

    s1, s2 = q.softmax(-1), k.softmax(-1)  # e.g. agent-style low-rank factors
    got = ops.ppma_decomposed_attention(s1, s2, v, la, lb, form=form, impl='torch', chunk=2)
    np.testing.assert_allclose(got.numpy(), dense(s1, s2, v.numpy()), rtol=1e-9, atol=1e-11)
    elu = torch.nn.functional.elu
    num = dense(elu(q) + 1, elu(k) + 1, v.numpy())  # normalized: rows of the masked map sum to one
    got = ops.ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True, eps=0.0, form=form)
    np.testing.assert_allclose(got.numpy(), num / dense(elu(q) + 1, elu(k) + 1, ones), rtol=1e-9)
    nq, nk = qkv(2, 2, 5, 6, 3, seed=6)[:2]  # the mass from other features (MLLA's un-rotated ones)
    got = ops.ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True, eps=0.0, form=form,
                                normalizer=(nq, nk))
    np.testing.assert_allclose(got.numpy(), num / dense(elu(nq) + 1, elu(nk) + 1, ones), rtol=1e-9)


LOG_DECAY = torch.tensor([-0.3, -0.6], dtype=torch.float64)
# name: (op, (h, w, d, seed), which of q, k, v, la, lb it takes, fast_mode (random projections of the Jacobian:
# every input's gradient still exercised), also on whole attention's blockwise branch); chunk=2 runs the
# chunkwise scan on the length-3 and length-5 lines
GRADCHECKS = {
    **{f'whole {form} {impl}': (partial(ops.ppma_attention, scale=0.8, form=form, impl=impl), (3, 4, 2, 3), 'qkvab',
                                True, impl == 'torch') for form in FORMS for impl in IMPLS},
    **{f'criss_cross {form} {impl}': (partial(ops.criss_cross_attention, scale=0.8, form=form, impl=impl), (3, 5, 3, 3),
                                      'qkvab', False, False) for form in ('release', 'h2v') for impl in IMPLS},
    'manhattan': (lambda *a: ops.manhattan_attention(*a, LOG_DECAY, impl='torch'), (3, 4, 3, 3), 'qkv', False, True),
    'rmt_criss_cross': (lambda *a: ops.rmt_criss_cross_attention(*a, LOG_DECAY, impl='torch'), (3, 4, 3, 3), 'qkv',
                        False, False),
    'linear': (partial(ops.ppma_linear_attention, impl='torch', chunk=2), (3, 4, 3, 3), 'qkvab', True, False),
    **{f'matvec {form}': (partial(ops.polyline_mask_matvec, form=form, chunk=2, impl='torch'), (3, 5, 2, 6), 'vab',
                          False, False) for form in ('v2h', 'h2v')},
    **{f'decomposed {form}': (partial(ops.ppma_decomposed_attention, form=form, impl='torch', chunk=2), (3, 5, 2, 6),
                              'qkvab', True, False) for form in ('v2h', 'h2v')},
}


@pytest.mark.parametrize('name, blockwise', [(name, False) for name in GRADCHECKS] +
                         [(name, True) for name, case in GRADCHECKS.items() if case[-1]])
def test_gradcheck(name, blockwise, monkeypatch):
    op, (h, w, d, seed), takes, fast, _ = GRADCHECKS[name]
    if blockwise:
        force_blockwise(monkeypatch)
    named = dict(zip('qkvab', inputs(1, 2, h, w, d, seed)))
    assert torch.autograd.gradcheck(op, leaf(*(named[c] for c in takes)), fast_mode=fast)


@pytest.mark.parametrize('op', [ops.ppma_attention, ops.manhattan_attention], ids=['ppma', 'manhattan'])
def test_torch_and_reference_agree_on_a_larger_map(op, whole_path):
    q, k, v = qkv(2, 2, 6, 9, 4, seed=8)
    leaves = [q, k, v, *decays(2, 2, 6, 9, seed=9)] if op is ops.ppma_attention else [q, k, v, LOG_DECAY.clone()]
    results = [out_and_grads(partial(op, scale=0.5, impl=impl), leaf(*leaves)) for impl in IMPLS]
    for a, b in zip(*results):  # outputs and every input gradient, decay tables included
        torch.testing.assert_close(a, b, **CLOSE)


OPS = {
    'whole': lambda q, k, v, la, lb: ops.ppma_attention(q, k, v, la, lb, scale=q.shape[-1]**-0.5),
    'criss_cross': lambda q, k, v, la, lb: ops.criss_cross_attention(q, k, v, la, lb, scale=q.shape[-1]**-0.5),
    'linear': lambda q, k, v, la, lb: ops.ppma_linear_attention(q, k, v, la, lb, feature_map='elu', normalize=True),
}


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('op', sorted(OPS))
def test_half_inputs_are_finite_and_close_to_float32(op, dtype, whole_path):
    xs = inputs(2, 2, 7, 9, 16, seed=1, dtype=torch.float32)
    want = OPS[op](*xs)
    got = OPS[op](*(t.to(dtype) for t in xs))
    assert got.dtype == dtype and torch.isfinite(got).all()
    rel = (got.float() - want).norm() / want.norm()
    assert rel < 2e-2, f'{op} {dtype}: relative error {rel:.3g}'


@pytest.mark.parametrize('op', sorted(OPS))
@pytest.mark.parametrize('hw', [(1, 1), (1, 9), (9, 1), (13, 17)])
def test_extreme_decays_give_finite_values_and_gradients(op, hw, whole_path):
    xs = qkv(1, 2, *hw, 4, dtype=torch.float32) + decays(1, 2, *hw, offset=1e4, dtype=torch.float32)
    out, *grads = out_and_grads(OPS[op], leaf(*xs))
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    with torch.no_grad():  # the inference paths
        torch.testing.assert_close(OPS[op](*xs), out)
    if op == 'whole':  # nothing but the token itself survives such a mask
        torch.testing.assert_close(out, xs[2])
