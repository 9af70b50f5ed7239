"""The ops' one vocabulary: signatures, the implementation table, validation before dispatch, the torch
branch of whole attention, and the previous release's spellings (they warn and give identical results)."""
import inspect
import warnings

import pytest
import torch

import mmppma.ops as ops
import mmppma.ops.attention as attention_module
from mmppma.ops.dispatch import IMPLEMENTATIONS, resolve_impl
from mmppma.utils.deprecation import renamed_arguments

from .test_attention import qkv
from .test_masks_and_scans import decays

# the options every op takes after its tensors, in the documented order
ORDER = ('scale', 'form', 'feature_map', 'normalize', 'normalizer', 'eps', 'space', 'queries', 'impl', 'chunk')


@pytest.mark.parametrize('name', ops.OPS)
def test_signature_follows_the_vocabulary(name):
    fn = getattr(ops, name)
    params = list(inspect.signature(fn).parameters.values())
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    options = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
    assert all(p.default is p.empty for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)
    assert options == [o for o in ORDER if o in options], f'{name}: options {options} out of order'
    assert set(options) <= set(ORDER)
    for decay in ('a', 'g', 'gamma', 'mask', 'order'):
        assert decay not in positional + options
    assert ('impl' in options) == (name in IMPLEMENTATIONS)


def test_resolve_impl_reads_the_one_table():
    x = torch.zeros(1)
    for op, impls in IMPLEMENTATIONS.items():
        assert set(impls) <= {'reference', 'torch', 'triton'}
        assert resolve_impl('reference', op, [x]) == 'reference'
        assert resolve_impl('auto', op, [x]) == 'torch'  # CPU tensors
    with pytest.raises(KeyError, match='not an op'):
        resolve_impl('torch', 'polyline_mask', [x])


@pytest.mark.parametrize('impl', ['reference', 'torch', 'triton'])
@pytest.mark.parametrize('op', [ops.manhattan_attention, ops.rmt_criss_cross_attention])
def test_log_decay_is_checked_before_dispatch(op, impl):
    q, k, v = qkv(2, 3, 2, 3, 4)
    for bad in (torch.zeros(2), torch.zeros(3, 3), torch.zeros(1, 1, 3), torch.zeros(3, dtype=torch.long)):
        with pytest.raises(ValueError, match='log_decay'):
            op(q, k, v, bad, impl=impl)


@pytest.mark.parametrize('impl', ['reference', 'torch', 'triton'])
def test_scan_inputs_are_checked_before_dispatch(impl):
    x = torch.zeros(2, 5, 3)
    with pytest.raises(ValueError, match='log_decay'):
        ops.decay_scan_1d(x, torch.zeros(2, 4), impl=impl)
    with pytest.raises(ValueError, match='floating point'):
        ops.decay_scan_1d(x, torch.zeros(2, 5, dtype=torch.long), impl=impl)


def test_whole_attention_branch_is_the_one_taken(monkeypatch):
    assert attention_module.SMALL_ELEMENTS == 2**22
    assert ops.whole_attention_branch(1, 4, 16, 32) == 'autograd'  # 4 * 512^2 = 2^20
    assert ops.whole_attention_branch(1, 4, 32, 32) == 'autograd'  # 4 * 1024^2 = 2^22
    assert ops.whole_attention_branch(1, 4, 32, 33) == 'blockwise'
    assert ops.whole_attention_branch(1, 1, 1, 1, form='paper') == 'dense'
    assert ops.whole_attention_branch(1, 4, 32, 33, grad=False) == 'inference'
    calls = []
    library_op = attention_module.whole_attention_blockwise
    monkeypatch.setattr(attention_module, 'whole_attention_blockwise',
                        lambda *a: calls.append(torch.is_grad_enabled()) or library_op(*a))
    q, k, v = (t.requires_grad_() for t in qkv(1, 1, 3, 4, 2))
    la, lb = decays(1, 1, 3, 4)
    ops.ppma_attention(q, k, v, la, lb, impl='torch')
    assert calls == []  # the autograd branch
    with torch.no_grad():
        ops.ppma_attention(q, k, v, la, lb, impl='torch')
    assert calls == [False]  # the inference branch: the torch.library op, autograd off
    monkeypatch.setattr(attention_module, 'SMALL_ELEMENTS', 143)  # 12^2 = 144 elements
    assert ops.whole_attention_branch(1, 1, 3, 4) == 'blockwise'
    ops.ppma_attention(q, k, v, la, lb, impl='torch')
    assert calls == [False, True]  # the blockwise branch: the same op, recorded by autograd


def _new_and_old():
    """(name, new spelling, old spelling) calls of every op whose spelling changed."""
    q, k, v = qkv(1, 2, 3, 4, 2, seed=1)
    la, lb = decays(1, 2, 3, 4, seed=2)
    lc = decays(1, 2, 3, 4, seed=3)[0]
    g = torch.tensor([-0.2, -0.5], dtype=torch.float64)
    l3d = (la[:, :, None], lb[:, :, None], lc[:, :, None])
    x3, l3 = torch.randn(1, 2, 2, 3, 4, 3, dtype=torch.float64), -torch.rand(1, 2, 2, 3, 4, dtype=torch.float64)
    return [
        ('ppma_attention', lambda: ops.ppma_attention(q, k, v, la, lb, scale=0.5, form='v2h', impl='torch'),
         lambda: ops.ppma_attention(q, k, v, la, lb, 0.5, 'v2h', 'torch')),
        ('manhattan_attention', lambda: ops.manhattan_attention(q, k, v, g, scale=0.5, impl='reference'),
         lambda: ops.manhattan_attention(q, k, v, g, 0.5, 'reference')),
        ('rmt_criss_cross_attention', lambda: ops.rmt_criss_cross_attention(q, k, v, g, scale=0.5),
         lambda: ops.rmt_criss_cross_attention(q, k, v, g, 0.5)),
        ('criss_cross order=both', lambda: ops.criss_cross_attention(q, k, v, la, lb, scale=0.5),
         lambda: ops.criss_cross_attention(q, k, v, la, lb, scale=0.5, order='both')),
        ('criss_cross order=col_row', lambda: ops.criss_cross_attention(q, k, v, la, lb, form='v2h'),
         lambda: ops.criss_cross_attention(q, k, v, la, lb, order='col_row')),
        ('criss_cross positional row_col', lambda: ops.criss_cross_attention(q, k, v, la, lb, scale=0.3, form='h2v',
                                                                             impl='reference'),
         lambda: ops.criss_cross_attention(q, k, v, la, lb, 0.3, 'row_col', 'reference')),
        ('criss_cross form=row_col', lambda: ops.criss_cross_attention(q, k, v, la, lb, form='h2v'),
         lambda: ops.criss_cross_attention(q, k, v, la, lb, form='row_col')),
        ('polyline_mask', lambda: ops.polyline_mask(la, lb, form='h2v', space='linear'),
         lambda: ops.polyline_mask(la, lb, 'h2v', 'linear')),
        ('polyline_mask_3d', lambda: ops.polyline_mask_3d(*l3d, space='linear'),
         lambda: ops.polyline_mask_3d(*l3d, 'linear')),
        ('polyline_mask_matvec order=', lambda: ops.polyline_mask_matvec(v, la, lb, form='h2v', chunk=2),
         lambda: ops.polyline_mask_matvec(v, la, lb, order='h2v', chunk=2)),
        ('polyline_mask_matvec positional', lambda: ops.polyline_mask_matvec(v, la, lb, form='2d', chunk=2,
                                                                             impl='torch'),
         lambda: ops.polyline_mask_matvec(v, la, lb, '2d', 2, 'torch')),
        ('polyline_mask_matvec_3d', lambda: ops.polyline_mask_matvec_3d(x3, l3, l3, l3, chunk=2, impl='torch'),
         lambda: ops.polyline_mask_matvec_3d(x3, l3, l3, l3, 2, 'torch')),
        ('decay_scan_1d a=', lambda: ops.decay_scan_1d(v, la, chunk=2),
         lambda: ops.decay_scan_1d(v, a=la, chunk=2)),
        ('decay_scan_1d positional', lambda: ops.decay_scan_1d(v, la, chunk=2, impl='reference'),
         lambda: ops.decay_scan_1d(v, la, 2, 'reference')),
        ('ppma_decomposed_attention', lambda: ops.ppma_decomposed_attention(q, k, v, la, lb, form='v2h', chunk=2),
         lambda: ops.ppma_decomposed_attention(q, k, v, la, lb, mask='v2h', chunk=2)),
        ('ppma_decomposed_attention positional', lambda: ops.ppma_decomposed_attention(q, k, v, la, lb, form='h2v',
                                                                                       impl='reference'),
         lambda: ops.ppma_decomposed_attention(q, k, v, la, lb, 'h2v', 'reference')),
        ('ppma_linear_attention', lambda: ops.ppma_linear_attention(q, k, v, la, lb, form='h2v', feature_map='elu',
                                                                    normalize=True),
         lambda: ops.ppma_linear_attention(q, k, v, la, lb, 'elu', True, mask='h2v')),
    ]


@pytest.mark.parametrize('case', range(len(_new_and_old())), ids=[c[0] for c in _new_and_old()])
def test_old_spellings_warn_and_give_identical_results(case):
    _, new, old = _new_and_old()[case]
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the new spelling warns about nothing
        want = new()
    with pytest.warns(DeprecationWarning, match='deprecated and will be removed in the next release'):
        got = old()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_old_and_new_spelling_together_is_an_error():
    q, k, v = qkv(1, 1, 2, 2, 2)
    la, lb = decays(1, 1, 2, 2)
    with pytest.raises(TypeError, match="both 'order' .* and 'form'"):
        ops.criss_cross_attention(q, k, v, la, lb, order='both', form='release')
    with pytest.raises(TypeError, match="multiple values for argument 'form'"):
        ops.polyline_mask(la, lb, 'v2h', form='h2v')
    with pytest.raises(TypeError, match='takes 2 positional arguments but 5 were given'):
        ops.polyline_mask(la, lb, 'v2h', 'log', 'extra')


def test_renamed_arguments_names_each_old_spelling():

    @renamed_arguments(keywords={'old': 'new'}, values={'new': {'before': 'after'}}, positional=('old', ))
    def f(x, *, new='after'):
        return x, new

    with pytest.warns(DeprecationWarning, match=r"f: passing 'old' positionally \(pass new=\.\.\. by keyword\)"):
        assert f(1, 'x') == (1, 'x')
    with pytest.warns(DeprecationWarning, match=r"f: keyword 'old' \(use 'new'\)"):
        assert f(1, old='x') == (1, 'x')
    with pytest.warns(DeprecationWarning, match=r"f: new='before' \(use new='after'\)"):
        assert f(1, new='before') == (1, 'after')
    assert inspect.signature(f) == inspect.signature(f.__wrapped__)


def test_public_names_are_exported():
    assert set(ops.OPS) <= set(ops.__all__)
    assert all(callable(getattr(ops, name)) for name in ops.__all__ if name not in ('OPS', 'IMPLS', 'IMPLEMENTATIONS'))
