"""The ops' ``torch.library`` ops by ``torch.library.opcheck`` (schema, fake implementations, autograd
registration, dynamic-shape tracing): the torch path's blockwise whole attention, the layers' tokens_to_nchw and
the Triton kernels' ops; the ops under ``torch.compile``: no graph breaks, compiled equals eager."""
import pytest
import torch

from mmppma import ops
from mmppma.models.layers.conv import tokens_to_nchw
from mmppma.ops.masks import column_segment_sums, decay_tables, manhattan_segment_sums, row_segment_sums

from ..conftest import COMPILE_BACKENDS
from ..models.conftest import TWO_STAGES
from .oracle import decays, graph_code, inputs, leaf, out_and_grads, qkv
from .test_attention import force_blockwise

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
from mmppma.ops.line.triton_impl import line_attention_backward_op, line_attention_op  # noqa: E402
from mmppma.ops.scan.triton_impl import scan_op  # noqa: E402
from mmppma.ops.whole.triton_impl import whole_attention_backward_op, whole_attention_op  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
NO_AUTOGRAD = ('test_schema', 'test_faketensor', 'test_aot_dispatch_dynamic')  # a backward op: not differentiated
BLOCKWISE, BLOCKWISE_BACKWARD = (torch.ops.mmppma.whole_attention_blockwise,
                                 torch.ops.mmppma.whole_attention_blockwise_backward)


def randn(*shapes):
    return [torch.randn(*shape).to(DEVICE) for shape in shapes]


def blockwise_inputs(b, heads, h, w, d, dv, dtype=torch.float64, table_batch=None):
    """q, k, v (B, heads, N, d) and the row and column segment-sum tables."""
    la, lb = decays(table_batch or b, heads, h, w, seed=1)
    return [t.flatten(2, 3) for t in qkv(b, heads, h, w, d, dtype=dtype, dv=dv)] + [
        row_segment_sums(la).to(dtype), column_segment_sums(lb).to(dtype)]


@pytest.mark.parametrize('form', ['release', 'v2h', 'h2v'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_blockwise_op(form, dtype):
    torch.library.opcheck(BLOCKWISE, (*(t.requires_grad_() for t in blockwise_inputs(2, 2, 3, 5, 4, 3, dtype)), form))
    q, k, v = torch.randn(3, 2, 3, 24, 5, dtype=torch.float64)  # Manhattan tables: stride 0 over B, H
    torch.library.opcheck(BLOCKWISE, (q, k, v, *manhattan_segment_sums(-torch.rand(3, dtype=q.dtype), 4, 6, q.dtype),
                                      'v2h'))


@pytest.mark.parametrize('table_grads', [True, False])
def test_blockwise_backward_op(table_grads):
    """With table gradients also on q, k, v viewed from (B, N, heads, d) as the layers pass them: outputs contiguous,
    as the fake impls say."""
    *qkv_, sa, sb = blockwise_inputs(2, 2, 4, 3, 4, 2, table_batch=1)
    tables = [sa.shape, sb.shape] if table_grads else [(0, ), (0, )]
    for x in [qkv_] + [[t.transpose(1, 2).contiguous().transpose(1, 2) for t in qkv_]] * table_grads:
        out = BLOCKWISE(*x, sa, sb, 'release')
        args = (torch.randn_like(out), *x, sa, sb, 'release', table_grads)
        torch.library.opcheck(BLOCKWISE_BACKWARD, args, test_utils=NO_AUTOGRAD)
        grads = BLOCKWISE_BACKWARD(*args)
        assert out.is_contiguous() and all(t.is_contiguous() for t in grads)
        assert [t.shape for t in grads] == [t.shape for t in x] + tables


def test_tokens_to_nchw_op_is_a_channels_last_copy():
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    y = tokens_to_nchw(x)
    assert y.shape == (2, 4, 3, 5) and y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, x.detach().permute(0, 3, 1, 2)) and y.data_ptr() != x.data_ptr()
    grad = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    y.backward(grad)
    assert torch.equal(x.grad, grad.permute(0, 2, 3, 1))
    torch.library.opcheck(torch.ops.mmppma.tokens_to_nchw, (x.detach().requires_grad_(), ))


def _tables(bh, h, w):
    return [t.to(DEVICE).contiguous() for t in decay_tables(*decays(bh, 1, h, w, seed=1, dtype=torch.float32))]


@pytest.mark.parametrize('form', ['release', 'v2h', 'h2v'])
def test_whole_attention_ops(form):
    """The ops take q, k, v (B, heads, H, W, .) in any layout with channels contiguous: here heads-last storage."""
    q, k, v = (t.permute(0, 3, 1, 2, 4) for t in randn((2, 3, 5, 1, 8), (2, 3, 5, 1, 8), (2, 3, 5, 1, 4)))
    tensors = (q, k, v, *_tables(2, 3, 5))
    torch.library.opcheck(whole_attention_op, (*[t.clone().requires_grad_() for t in tensors], 0.5, form))
    out, o, lse = whole_attention_op(*tensors, 0.5, form)
    assert out.shape == v.shape and o.shape == (1 + (form == 'release'), 2, 3, 5, 4) and lse.shape == o.shape[:-1]
    torch.library.opcheck(whole_attention_backward_op, (*randn((2, 1, 3, 5, 4)), *tensors, o, lse, 0.5, form),
                          test_utils=NO_AUTOGRAD)


@pytest.mark.parametrize('columns', [False, True])
def test_line_attention_ops(columns):
    q, k, x = (t.permute(0, 3, 1, 2, 4) for t in randn((2, 3, 5, 1, 8), (2, 3, 5, 1, 8), (2, 3, 5, 1, 4)))
    tensors = (q, k, x, _tables(2, 3, 5)[int(columns)])
    torch.library.opcheck(line_attention_op, (*[t.clone().requires_grad_() for t in tensors], 0.5, columns))
    out, lse = line_attention_op(*tensors, 0.5, columns)
    torch.library.opcheck(line_attention_backward_op, (*randn((2, 1, 3, 5, 4)), *tensors, out, lse, 0.5, columns),
                          test_utils=NO_AUTOGRAD)


def test_decay_scan_op():
    x, = randn((4, 7, 8))
    c = (-torch.rand(4, 7, generator=torch.Generator().manual_seed(1))).cumsum(-1).to(DEVICE)
    torch.library.opcheck(scan_op, (x.clone().requires_grad_(), c.clone().requires_grad_(), False))
    torch.library.opcheck(scan_op, (x, c, True), test_utils=NO_AUTOGRAD)


def test_triton_path_traces_without_graph_breaks():
    model = TWO_STAGES['PPMA']('triton').to(DEVICE).train()  # line attention and whole attention
    code = graph_code(model, torch.randn(1, 3, 32, 48, device=DEVICE))
    assert 'mmppma.whole_attention_triton' in code and 'mmppma.line_attention_triton' in code


WHOLE_OPS, FIXED_DECAY = ('ppma_attention', 'manhattan_attention'), ('manhattan_attention', 'rmt_criss_cross_attention')


def op_call(op, impl):
    """The op (``*_paper``: whole attention's paper form) on ``impl`` as a function of q, k, v, la, lb, log_decay."""
    name, options = op.removesuffix('_paper'), dict(form='paper') if op.endswith('_paper') else {}
    if name == 'ppma_linear_attention':
        options = dict(feature_map='elu', normalize=True, chunk=4)
    return lambda q, k, v, la, lb, log_decay: getattr(ops, name)(
        q, k, v, *((log_decay, ) if name in FIXED_DECAY else (la, lb)), impl=impl, **options)


def op_inputs(h, w, seed=0):
    return [t.to(DEVICE) for t in inputs(1, 2, h, w, 8, seed, torch.float32) + [-torch.rand(2)]]


@pytest.mark.parametrize('op, branch', [(op, grad) for grad in ('autograd', 'inference') for op in (
    *WHOLE_OPS, 'ppma_attention_paper', 'criss_cross_attention', 'rmt_criss_cross_attention', 'ppma_linear_attention')]
                         + [(op, 'blockwise') for op in WHOLE_OPS])
def test_torch_path_ops_trace_without_graph_breaks(op, branch, monkeypatch):
    """Whole attention's inference and blockwise branches are the mmppma::whole_attention_blockwise op."""
    if branch == 'blockwise':
        force_blockwise(monkeypatch, 64)
    code = graph_code(op_call(op, 'torch'), *(t.requires_grad_(branch != 'inference') for t in op_inputs(5, 7)))
    assert ('mmppma.whole_attention_blockwise' in code) == (op in WHOLE_OPS and branch != 'autograd')


@pytest.mark.parametrize('op, impl, sizes, backend', [
    *[pytest.param(op, 'triton', [(3, 4)], 'aot_eager', id=op)
      for op in ('ppma_attention', 'rmt_criss_cross_attention')],
    *[pytest.param(op, impl, sizes, *backend.values, marks=backend.marks, id=f'{op}-{impl}-{backend.id}')
      for impl, sizes, names in (('triton', [(3, 5), (4, 7)], ('ppma_attention', 'criss_cross_attention',
                                                               'ppma_linear_attention')),
                                 ('blockwise', [(5, 7), (6, 9)], WHOLE_OPS))
      for op in names for backend in COMPILE_BACKENDS]])
def test_ops_trace_in_one_graph_and_compiled_equal_eager(op, impl, sizes, backend, monkeypatch):
    """The Triton path: one graph with the Triton op in it (the blockwise branch's: test above); compiled, the output
    and every input gradient equal eager's at each size (a second size recompiles with dynamic shapes)."""
    if impl == 'blockwise':
        force_blockwise(monkeypatch, 64)
    call = op_call(op, 'torch' if impl == 'blockwise' else impl)

    def fn(q, *rest):
        return torch.tanh(call(q * 2, *rest)).sum(-1)

    compiled = torch.compile(fn, backend=backend)
    for h, w in sizes:
        leaves = op_inputs(h, w, seed=h)
        if impl == 'triton' and (h, w) == sizes[0]:
            assert '_triton' in graph_code(fn, *leaves)
        got, want = (out_and_grads(run, leaf(*leaves)) for run in (compiled, fn))
        for i, (a, b) in enumerate(zip(got, want)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f'{op} {h}x{w} tensor {i}')


def test_an_impl_that_cannot_run_says_so_under_compile():
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: ops.ppma_attention(*a, form='paper', impl='triton'))
    with pytest.raises(NotImplementedError, match="form='paper'; use impl='torch'"):  # not an inductor error
        compiled(*op_inputs(3, 4)[:5])
