"""The ops' ``torch.library`` ops by ``torch.library.opcheck`` (schema, fake implementations, autograd
registration, dynamic-shape tracing): the torch path's blockwise whole attention, the layers' tokens_to_nchw and
the Triton kernels' ops (``TRITON_INTERPRET=1`` without a GPU, tests/conftest.py); the Triton path under
``torch.compile``: no graph breaks, compiled equals eager."""
import pytest
import torch

from mmppma import ops
from mmppma.models.backbones import PPMA
from mmppma.models.layers.conv import tokens_to_nchw
from mmppma.ops.masks import column_segment_sums, decay_tables, manhattan_segment_sums, row_segment_sums

from ..conftest import COMPILE_BACKENDS
from .oracle import decays

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
from mmppma.ops.line.triton_impl import line_attention_backward_op, line_attention_op  # noqa: E402
from mmppma.ops.scan.triton_impl import scan_op  # noqa: E402
from mmppma.ops.whole.triton_impl import whole_attention_backward_op, whole_attention_op  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
NO_AUTOGRAD = ('test_schema', 'test_faketensor', 'test_aot_dispatch_dynamic')  # a backward op: not differentiated
BLOCKWISE, BLOCKWISE_BACKWARD = (torch.ops.mmppma.whole_attention_blockwise,
                                 torch.ops.mmppma.whole_attention_blockwise_backward)


def randn(*shapes, seed=0, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=dtype).to(device) for shape in shapes]


def blockwise_inputs(b, heads, h, w, d, dv, dtype=torch.float64, table_batch=None):
    q, k, v = randn((b, heads, h * w, d), (b, heads, h * w, d), (b, heads, h * w, dv), dtype=dtype, device='cpu')
    la, lb = decays(table_batch or b, heads, h, w, seed=1)
    return q, k, v, row_segment_sums(la).to(dtype), column_segment_sums(lb).to(dtype)


@pytest.mark.parametrize('form', ['release', 'v2h', 'h2v'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_blockwise_op(form, dtype):
    torch.library.opcheck(BLOCKWISE, (*(t.requires_grad_() for t in blockwise_inputs(2, 2, 3, 5, 4, 3, dtype)), form))
    q, k, v = randn(*[(2, 3, 24, 5)] * 3, dtype=torch.float64, device='cpu')  # Manhattan tables: stride 0 over B, H
    torch.library.opcheck(BLOCKWISE, (q, k, v, *manhattan_segment_sums(-torch.rand(3, dtype=q.dtype), 4, 6, q.dtype),
                                      'v2h'))


@pytest.mark.parametrize('table_grads', [True, False])
def test_blockwise_backward_op(table_grads):
    q, k, v, sa, sb = blockwise_inputs(2, 2, 4, 3, 4, 2, table_batch=1)
    args = (torch.randn(2, 2, 12, 2, dtype=torch.float64), q, k, v, sa, sb, 'release', table_grads)
    torch.library.opcheck(BLOCKWISE_BACKWARD, args, test_utils=NO_AUTOGRAD)
    dq, dk, dv, dsa, dsb = BLOCKWISE_BACKWARD(*args)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert (dsa.shape, dsb.shape) == ((sa.shape, sb.shape) if table_grads else ((0, ), (0, )))


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
    tensors = (*randn((2, 15, 8), (2, 15, 8), (2, 15, 4)), *(t[:, 0] for t in _tables(2, 3, 5)))
    torch.library.opcheck(whole_attention_op, (*[t.clone().requires_grad_() for t in tensors], 0.5, form))
    out, o, lse = whole_attention_op(*tensors, 0.5, form)
    assert o.shape == (1 + (form == 'release'), 2, 15, 4) and lse.shape == o.shape[:-1]
    torch.library.opcheck(whole_attention_backward_op, (*randn((2, 15, 4), seed=2), *tensors, o, lse, 0.5, form),
                          test_utils=NO_AUTOGRAD)


@pytest.mark.parametrize('columns', [False, True])
def test_line_attention_ops(columns):
    tensors = (*randn((2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 4)), _tables(2, 3, 5)[int(columns)][:, 0])
    torch.library.opcheck(line_attention_op, (*[t.clone().requires_grad_() for t in tensors], 0.5, columns))
    out, lse = line_attention_op(*tensors, 0.5, columns)
    torch.library.opcheck(line_attention_backward_op, (*randn((2, 3, 5, 4), seed=2), *tensors, out, lse, 0.5,
                                                       columns), test_utils=NO_AUTOGRAD)


def test_decay_scan_op():
    x, = randn((4, 7, 8))
    c = (-torch.rand(4, 7, generator=torch.Generator().manual_seed(1))).cumsum(-1).to(DEVICE)
    torch.library.opcheck(scan_op, (x.clone().requires_grad_(), c.clone().requires_grad_(), False))
    torch.library.opcheck(scan_op, (x, c, True), test_utils=NO_AUTOGRAD)


def test_triton_path_traces_without_graph_breaks():
    arch = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[2, 2], mlp_ratios=[2, 2],
                attn_types=['criss_cross', 'whole'])  # line attention and whole attention
    model = PPMA(arch=arch, impl='triton', out_indices=(0, 1)).to(DEVICE).train()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(torch.randn(1, 3, 32, 48, device=DEVICE))
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    code = '\n'.join(graph.code for graph in explained.graphs)
    assert 'mmppma.whole_attention_triton' in code and 'mmppma.line_attention_triton' in code


@pytest.mark.parametrize('op, sizes, backend', [
    *[pytest.param(op, [(3, 4)], 'aot_eager', id=op) for op in ('ppma_attention', 'rmt_criss_cross_attention')],
    *[pytest.param(op, [(3, 5), (4, 7)], *backend.values, marks=backend.marks, id=f'{op}-dynamic-{backend.id}')
      for op in ('ppma_attention', 'criss_cross_attention', 'ppma_linear_attention') for backend in COMPILE_BACKENDS]])
def test_triton_ops_trace_in_one_graph_and_compiled_equal_eager(op, sizes, backend):
    """One graph with the mmppma::*_triton op in it; compiled, the output and every input gradient equal eager's
    at each size (a second size recompiles with dynamic shapes)."""
    def fn(q, k, v, *decay):
        options = dict(feature_map='elu', normalize=True) if op == 'ppma_linear_attention' else {}
        return torch.tanh(getattr(ops, op)(q * 2, k, v, *decay, impl='triton', **options)).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    for h, w in sizes:
        g = torch.Generator().manual_seed(h)
        leaves = [torch.randn(1, 2, h, w, 8, generator=g) for _ in range(3)]
        leaves += ([-torch.rand(2, generator=g)] if op == 'rmt_criss_cross_attention' else
                   [-torch.rand(1, 2, h, w, generator=g) for _ in range(2)])
        leaves = [t.to(DEVICE) for t in leaves]
        if (h, w) == sizes[0]:
            explained = torch._dynamo.explain(fn)(*leaves)
            assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
            assert '_triton' in '\n'.join(graph.code for graph in explained.graphs)
        results = []
        for run in (compiled, fn):
            xs = [t.clone().requires_grad_() for t in leaves]
            out = run(*xs)
            grads = torch.autograd.grad(out, xs, torch.linspace(-1, 1, out.numel(), device=DEVICE).view_as(out))
            results.append([out.detach(), *grads])
        for i, (got, want) in enumerate(zip(*results)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f'{op} {h}x{w} tensor {i}')


def test_an_impl_that_cannot_run_says_so_under_compile():
    q, k, v = randn(*[(1, 2, 3, 4, 8)] * 3)
    la, lb = (-t.abs() for t in randn((1, 2, 3, 4), (1, 2, 3, 4), seed=1))
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: ops.ppma_attention(*a, form='paper', impl='triton'))
    with pytest.raises(NotImplementedError, match="form='paper'; use impl='torch'"):  # not an inductor error
        compiled(q, k, v, la, lb)
