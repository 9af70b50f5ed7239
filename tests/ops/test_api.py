"""The ops' one vocabulary: signatures, the implementation table, validation before dispatch, the torch branch
of whole attention."""
import inspect

import pytest
import torch

import mmppma.ops as ops
import mmppma.ops.whole
import mmppma.ops.whole.torch_impl as whole_torch
from mmppma.ops.forms import CRISS_CROSS_FORMS, MASK_FORMS, WHOLE_FORMS
from mmppma.ops.plan import IMPLEMENTATIONS, IMPLEMENTATIONS_BY_FORM, resolve_impl

from .oracle import inputs, qkv

IMPLS = ('reference', 'torch', 'triton')
FORMS = {'ppma_attention': WHOLE_FORMS, 'criss_cross_attention': CRISS_CROSS_FORMS, 'polyline_mask_matvec': MASK_FORMS,
         'ppma_decomposed_attention': MASK_FORMS, 'ppma_linear_attention': MASK_FORMS}
ORDER = ('scale', 'form', 'tables', 'feature_map', 'normalize', 'normalizer', 'eps', 'space', 'queries', 'impl',
         'chunk')


@pytest.mark.parametrize('name', ops.OPS)
def test_signature_follows_the_vocabulary(name):
    """Tensors positional, then the options keyword-only in the documented order; no other decay or form name."""
    params = list(inspect.signature(getattr(ops, name)).parameters.values())
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    options = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
    assert all(p.default is p.empty for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
    assert options == [o for o in ORDER if o in options], f'{name}: options {options} out of order'
    assert set(options) <= set(ORDER) and not {'a', 'g', 'gamma', 'mask', 'order'} & set(positional + options)
    assert ('impl' in options) == (name in IMPLEMENTATIONS)


def test_public_names_are_exported():
    assert set(ops.OPS) <= set(ops.__all__)
    assert all(callable(getattr(ops, name)) for name in ops.__all__ if name not in ('OPS', 'IMPLS', 'IMPLEMENTATIONS'))


def test_resolve_impl_reads_the_one_table_and_the_environment(monkeypatch):
    x = torch.zeros(1)
    for op, impls in IMPLEMENTATIONS.items():
        assert set(impls) <= set(IMPLS)
        assert resolve_impl('reference', op, [x]) == 'reference' and resolve_impl('auto', op, [x]) == 'torch'
    with pytest.raises(KeyError, match='not an op'):
        resolve_impl('torch', 'polyline_mask', [x])
    with pytest.raises(ValueError, match="'auto', 'torch', 'triton', 'reference'"):
        resolve_impl('cuda', 'ppma_attention', [x])
    monkeypatch.setenv('MMPPMA_IMPL', 'reference')
    assert resolve_impl('auto', 'ppma_attention', [x]) == 'reference'
    calls, original = [], mmppma.ops.whole.reference.whole_reference
    monkeypatch.setattr(mmppma.ops.whole.reference, 'whole_reference', lambda *a: calls.append(1) or original(*a))
    ops.ppma_attention(*inputs(1, 1, 2, 3, 4))
    assert calls, 'MMPPMA_IMPL=reference did not route auto to the reference implementation'
    monkeypatch.setenv('MMPPMA_IMPL', 'fast')
    with pytest.raises(ValueError, match='MMPPMA_IMPL'):
        resolve_impl('auto', 'ppma_attention', [x])


def test_the_table_is_keyed_by_op_and_form():
    """Every op's forms are rows; whole attention's paper form alone has no kernel; IMPLEMENTATIONS: any form's."""
    forms = {op: inspect.signature(getattr(ops, op)).parameters.get('form') for op in IMPLEMENTATIONS}
    for op, param in forms.items():
        rows = {form for name, form in IMPLEMENTATIONS_BY_FORM if name == op}
        assert rows == ({None} if param is None else set(FORMS[op])), op
    assert [key for key, impls in IMPLEMENTATIONS_BY_FORM.items() if 'triton' not in impls] == [
        ('ppma_attention', 'paper')]
    assert IMPLEMENTATIONS['ppma_attention'] == ('reference', 'torch', 'triton')
    x = torch.zeros(1)
    assert resolve_impl('reference', 'ppma_attention', [x], 'paper') == 'reference'
    with pytest.raises(NotImplementedError, match="form='paper'.*impl='torch'"):
        resolve_impl('triton', 'ppma_attention', [x], 'paper')
    with pytest.raises(ValueError, match="form='2d' is not one of its forms 'release', 'paper'"):
        resolve_impl('torch', 'ppma_attention', [x], '2d')


Q, K, V, LA, LB = inputs(1, 2, 3, 4, 5)
WHOLE_AND_CRISS_CROSS = (ops.ppma_attention, ops.criss_cross_attention)
QKV_2X3 = qkv(2, 3, 2, 3, 4)  # batch 2, heads 3: a log-decay is (3,) or (2, 3)
BAD_LOG_DECAYS = (torch.zeros(2), torch.zeros(3, 3), torch.zeros(1, 1, 3), torch.zeros(3, dtype=torch.long))
SCAN_X = torch.zeros(2, 5, 3)
BAD_INPUTS = [  # (op, its tensors, its options, what the ValueError says); log-decays checked before dispatch
    *[(fn, (Q, K[..., :4], V, LA, LB), {}, r'q, k: \(B, heads, H, W, d\)') for fn in WHOLE_AND_CRISS_CROSS],
    *[(fn, (Q, K, V, LA[..., :3], LB), {}, r'la \(horizontal\), lb \(vertical\) log-decays: \(B, heads, H, W\)')
      for fn in WHOLE_AND_CRISS_CROSS],
    *[(fn, (Q[0], K[0], V[0], LA[0], LB[0]), {}, r'\(B, heads, H, W, d\)') for fn in WHOLE_AND_CRISS_CROSS],
    *[(fn, (Q, K, V, LA, LB), dict(form='x'), 'form') for fn in WHOLE_AND_CRISS_CROSS],
    (ops.ppma_attention, (Q.long(), K, V, LA, LB), {}, 'floating point'),
    (ops.ppma_linear_attention, (Q, K[:, :1], V, LA, LB), {}, r'\(B, heads, H, W, r\)'),
    (ops.ppma_linear_attention, (Q, K, V, LA, LB), dict(normalizer=(Q, K)), 'normalize=True'),
    (ops.ppma_linear_attention, (Q, K, V, LA, LB), dict(normalize=True, normalizer=(Q[:, :1], K)), 'shaped like q'),
    (ops.polyline_mask_matvec, (V[:, :, :, :3], LA, LB), {}, r'\(B, heads, H, W'),
    (ops.polyline_mask_matvec, (V, LA, LB[..., :3]), {}, r'\(B, heads, H, W'),
    (ops.polyline_mask, (LA, LB), dict(form='vh'), "'v2h', 'h2v', '2d'"),
    (ops.polyline_mask_matvec, (V, LA, LB), dict(form='x'), 'form'),
    *[(op, (*QKV_2X3, bad), dict(impl=impl), 'log_decay') for op in (ops.manhattan_attention,
                                                                      ops.rmt_criss_cross_attention)
      for impl in IMPLS for bad in BAD_LOG_DECAYS],
    *[(ops.decay_scan_1d, (SCAN_X, torch.zeros(2, 4)), dict(impl=impl), 'log_decay') for impl in IMPLS],
    *[(ops.decay_scan_1d, (SCAN_X, torch.zeros(2, 5, dtype=torch.long)), dict(impl=impl), 'floating point')
      for impl in IMPLS],
]


@pytest.mark.parametrize('op, tensors, options, match', BAD_INPUTS, ids=[f'{case[0].__name__}' for case in BAD_INPUTS])
def test_bad_input_raises_naming_the_expected_layout(op, tensors, options, match):
    with pytest.raises(ValueError, match=match):
        op(*tensors, **options)


def test_whole_attention_branch_is_the_one_taken(monkeypatch):
    assert whole_torch.SMALL_ELEMENTS == 2**22
    for args, kwargs, branch in (((1, 4, 16, 32), {}, 'autograd'), ((1, 4, 32, 32), {}, 'autograd'),  # 2^20, 2^22
                                 ((1, 4, 32, 33), {}, 'blockwise'), ((1, 1, 1, 1), dict(form='paper'), 'dense'),
                                 ((1, 4, 32, 33), dict(grad=False), 'inference')):
        assert ops.whole_attention_branch(*args, **kwargs) == branch
    calls, library_op = [], whole_torch.whole_attention_blockwise
    monkeypatch.setattr(whole_torch, 'whole_attention_blockwise',
                        lambda *a: calls.append(torch.is_grad_enabled()) or library_op(*a))
    q, k, v, la, lb = inputs(1, 1, 3, 4, 2)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ops.ppma_attention(q, k, v, la, lb, impl='torch')
    assert calls == []  # the autograd branch
    with torch.no_grad():
        ops.ppma_attention(q, k, v, la, lb, impl='torch')
    assert calls == [False]  # the inference branch: the torch.library op, autograd off
    monkeypatch.setattr(whole_torch, 'SMALL_ELEMENTS', 143)  # 12^2 = 144 elements
    assert ops.whole_attention_branch(1, 1, 3, 4) == 'blockwise'
    ops.ppma_attention(q, k, v, la, lb, impl='torch')
    assert calls == [False, True]  # the blockwise branch: the same op, recorded by autograd
