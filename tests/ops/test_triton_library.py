"""The Triton kernels' ``torch.library`` ops (``mmppma::whole_attention_triton``, ``line_attention_triton``,
``decay_scan_triton`` and the backwards): schema, fake implementations, autograd registration and dynamic-shape
tracing by ``torch.library.opcheck``; ``torch.compile`` traces the triton path without graph breaks and equals
eager. Without a GPU the kernels run under ``TRITON_INTERPRET=1`` (tests/conftest.py)."""
import pytest
import torch

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')

from mmppma import ops  # noqa: E402
from mmppma.models.backbones import PPMA  # noqa: E402
from mmppma.ops.line.triton_impl import line_attention_backward_op, line_attention_op  # noqa: E402
from mmppma.ops.masks import decay_tables  # noqa: E402
from mmppma.ops.scan.triton_impl import scan_op  # noqa: E402
from mmppma.ops.whole.triton_impl import whole_attention_backward_op, whole_attention_op  # noqa: E402

from ..conftest import COMPILE_BACKENDS  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
# a backward op is not differentiated again: no autograd registration to check
NO_AUTOGRAD = ('test_schema', 'test_faketensor', 'test_aot_dispatch_dynamic')


def _tensors(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(DEVICE) for shape in shapes]


def _tables(bh, h, w, seed=1):
    g = torch.Generator().manual_seed(seed)
    la, lb = (-torch.rand(bh, h, w, generator=g) for _ in range(2))
    return [t.to(DEVICE).contiguous() for t in decay_tables(la, lb)]


@pytest.mark.parametrize('form', ['release', 'v2h', 'h2v'])
def test_whole_attention_ops_pass_opcheck(form):
    bh, h, w, d, dv = 2, 3, 5, 8, 4
    q, k, v = _tensors((bh, h * w, d), (bh, h * w, d), (bh, h * w, dv))
    ca, cb = _tables(bh, h, w)
    tensors = (q, k, v, ca, cb)
    torch.library.opcheck(whole_attention_op, (*[t.clone().requires_grad_() for t in tensors], 0.5, form))
    out, o, lse = whole_attention_op(*tensors, 0.5, form)
    assert o.shape == (1 + (form == 'release'), bh, h * w, dv) and lse.shape == o.shape[:-1]
    dout, = _tensors((bh, h * w, dv), seed=2)
    torch.library.opcheck(whole_attention_backward_op, (dout, *tensors, o, lse, 0.5, form),
                          test_utils=NO_AUTOGRAD)


@pytest.mark.parametrize('columns', [False, True])
def test_line_attention_ops_pass_opcheck(columns):
    bh, h, w, d, dx = 2, 3, 5, 8, 4
    q, k, x = _tensors((bh, h, w, d), (bh, h, w, d), (bh, h, w, dx))
    c = _tables(bh, h, w)[int(columns)]
    tensors = (q, k, x, c)
    torch.library.opcheck(line_attention_op, (*[t.clone().requires_grad_() for t in tensors], 0.5, columns))
    out, lse = line_attention_op(*tensors, 0.5, columns)
    dout, = _tensors((bh, h, w, dx), seed=2)
    torch.library.opcheck(line_attention_backward_op, (dout, *tensors, out, lse, 0.5, columns),
                          test_utils=NO_AUTOGRAD)


def test_decay_scan_op_passes_opcheck():
    x, = _tensors((4, 7, 8))
    c = (-torch.rand(4, 7, generator=torch.Generator().manual_seed(1))).cumsum(-1).to(DEVICE)
    torch.library.opcheck(scan_op, (x.clone().requires_grad_(), c.clone().requires_grad_(), False))
    torch.library.opcheck(scan_op, (x, c, True), test_utils=NO_AUTOGRAD)


# one small PPMA: a criss-cross stage (line attention) and a whole-attention stage, on the triton path
ARCH = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[2, 2], mlp_ratios=[2, 2],
            attn_types=['criss_cross', 'whole'])


def test_triton_path_traces_without_graph_breaks():
    model = PPMA(arch=ARCH, impl='triton', out_indices=(0, 1)).to(DEVICE).train()
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
    """Each Triton op is a torch.library op that torch.compile traces with the code around it, in one graph (the
    mmppma::*_triton op in its code); compiled, the output and every input gradient equal eager's (float32, fused in
    another order), at each size (a second size recompiles with dynamic shapes)."""
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
    """Errors stay the ops' own under torch.compile: form='paper' has no triton kernel, and the error names the
    impl to use (not an inductor traceback)."""
    q, k, v = _tensors((1, 2, 3, 4, 8), (1, 2, 3, 4, 8), (1, 2, 3, 4, 8))
    la, lb = (-t.abs() for t in _tensors((1, 2, 3, 4), (1, 2, 3, 4), seed=1))
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: ops.ppma_attention(*a, form='paper', impl='triton'))
    with pytest.raises(NotImplementedError, match="for form='paper' use impl='torch'"):
        compiled(q, k, v, la, lb)
