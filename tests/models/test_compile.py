"""``torch.compile`` as mmengine's ``compile=True`` calls it: the backbones and the attention ops trace without
graph breaks; a classifier's train step traces on ``aot_eager``, one block compiles on inductor, each reusing its
dynamic graph; the full tier compiles whole backbones on inductor at three sizes (static, dynamic, reused)."""
import os

import pytest
import torch
import torch._dynamo

import mmppma.ops.whole.torch_impl as whole_torch
from mmppma import ops
from mmppma.models.backbones import MLLA, PPMA, RMT, VMINet

from ..conftest import COMPILE_BACKENDS

CC, WHOLE = 'criss_cross', 'whole'
# two stages of one block each: a criss-cross stage, then a whole-attention stage (PPMA, RMT)
PPMA_ARCH = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[2, 2], mlp_ratios=[2, 2], attn_types=[CC, WHOLE])
MLLA_ARCH = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[2, 2])
BACKBONES = {
    'PPMA': lambda: PPMA(arch=PPMA_ARCH, impl='torch', out_indices=(0, 1)),
    'RMT': lambda: RMT(arch=PPMA_ARCH, impl='torch', out_indices=(0, 1)),
    'MLLA': lambda: MLLA(arch=MLLA_ARCH, out_indices=(0, 1)),
    'PPMLA': lambda: MLLA(arch=MLLA_ARCH, mask='polyline', impl='torch', out_indices=(0, 1)),
    'VMINet': lambda: VMINet(dict(embed_dims=[8, 16], depths=[1, 1], mlp_ratios=[2, 2]), 3, 64, out_indices=(0, 1)),
}
# the first compiles static shapes, the second recompiles with dynamic ones, the third runs the dynamic graph
SIZES = [(64, 64), (96, 128), (128, 96)]


def _step(model, module, x):
    """Outputs and parameter gradients of a fixed linear functional of the outputs."""
    outs = module(x)
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)
    params = [p for p in model.parameters() if p.requires_grad]
    return [o.detach() for o in outs], list(torch.autograd.grad(loss, params))


def _assert_close(got, want, what):
    """max |got - want| <= 1e-4 * max |want| per tensor, the scale at least 1e-1 of the largest: a bias before a
    BatchNorm has a gradient that is zero up to float32 rounding of sums as large as the largest gradients."""
    floor = 1e-1 * max(w.abs().max().item() for w in want)
    for i, (g, w) in enumerate(zip(got, want)):
        scale = max(w.abs().max().item(), floor)
        err = (g - w).abs().max().item()
        assert err <= 1e-4 * scale, f'{what} {i}: max abs error {err:.3g}, scale {scale:.3g}'


@pytest.mark.parametrize('name', list(BACKBONES))
def test_backbone_traces_without_graph_breaks(name):
    model = BACKBONES[name]().train()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(torch.randn(2, 3, 64, 96))
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    # every conv is the mmppma::conv2d op (an aten conv would pin a dynamic graph's sizes on CPU)
    code = '\n'.join(graph.code for graph in explained.graphs)
    assert 'mmppma.conv2d' in code
    assert 'torch.conv2d' not in code and 'aten.convolution' not in code


# One inductor compile costs minutes on 2 cores: PPMA only, unless MMPPMA_COMPILE_ALL=1.
DYNAMIC = list(BACKBONES) if os.environ.get('MMPPMA_COMPILE_ALL') else ['PPMA']


def _reuses_dynamic_graph(run, sizes, reused_from: int = 2) -> None:
    """``run(i, h, w)`` at each size; from size ``reused_from`` on a recompile is an error (2: the first size
    compiles static shapes, the second dynamic ones; 1: compiled with ``dynamic=True``)."""
    for i, (h, w) in enumerate(sizes):
        with torch._dynamo.config.patch(error_on_recompile=i >= reused_from):
            run(i, h, w)


@pytest.mark.heavy
@pytest.mark.slow(minutes=12)
@pytest.mark.parametrize('name', DYNAMIC)
def test_backbone_compiles_with_dynamic_shapes_and_equals_eager(name):
    torch.manual_seed(0)
    model = BACKBONES[name]().train()
    torch._dynamo.reset()
    compiled = torch.compile(model)

    def run(i, h, w):
        x = torch.randn(2, 3, h, w)
        got_outs, got_grads = _step(model, compiled, x)
        want_outs, want_grads = _step(model, model, x)
        _assert_close(got_outs, want_outs, f'{name} {h}x{w} output')
        _assert_close(got_grads, want_grads, f'{name} {h}x{w} gradient')

    _reuses_dynamic_graph(run, SIZES)


def test_one_block_compiles_on_inductor_with_a_reused_dynamic_graph():
    """One PPMA block (its positional and FFN depthwise convs, no mask to keep the graph small) compiled on inductor
    with dynamic shapes, forward and backward: every conv is the mmppma::conv2d op, whose layout does not pin the
    dynamic graph's sizes, so the second size runs the graph the first compiled."""
    torch.manual_seed(0)
    model = PPMA(arch=dict(embed_dims=[16], depths=[1], num_heads=[2], mlp_ratios=[2], attn_types=[WHOLE]),
                 mask='none', impl='torch', out_indices=(0, )).train()
    stage = model.layers[0]  # the block and its position tables
    torch._dynamo.reset()
    compiled = torch.compile(stage, dynamic=True)

    def run(i, h, w):
        x = torch.randn(2, h, w, 16)
        got_outs, got_grads = _step(stage, lambda t: compiled(t)[:1], x)
        want_outs, want_grads = _step(stage, lambda t: stage(t)[:1], x)
        _assert_close(got_outs + got_grads, want_outs + want_grads, f'{h}x{w}')

    _reuses_dynamic_graph(run, [(8, 10), (12, 6)], reused_from=1)


def test_classifier_train_step_traces_on_aot_eager_and_reuses_its_dynamic_graph():
    """The tiny classification config's whole train step (data preprocessor, forward, loss, backward and the
    optimizer update), compiled as ``compile=dict(backend='aot_eager', dynamic=True)`` makes mmengine compile it:
    dynamo traces it all, a second input size reuses the dynamic graph, and the steps equal the eager twin's."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmpretrain.apis import get_model
    from mmpretrain.structures import DataSample
    cfg = Config.fromfile(os.path.join(os.path.dirname(__file__), '../../configs/tiny/ppma_t_tiny_in.py'))
    cfg.model.backbone.update(arch=PPMA_ARCH, out_indices=(1, ))  # a criss-cross and a whole-attention block
    cfg.model.head.in_channels = PPMA_ARCH['embed_dims'][-1]
    cfg.model.train_cfg = None  # mixup / cutmix draw random numbers on the host: one fixed batch per size instead
    cfg.model.head.loss.num_classes = cfg.num_classes  # else the loss sets it at its first call: a recompile
    cfg.model.backbone.drop_path_rate = 0.0  # the eager twin and the compiled step draw different random numbers
    models = [get_model(cfg).train() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    wrappers = [build_optim_wrapper(m, cfg.optim_wrapper) for m in models]
    torch._dynamo.reset()
    compiled = torch.compile(models[1].train_step, backend='aot_eager', dynamic=True)
    def run(i, h, w):
        data = dict(inputs=[torch.randint(0, 256, (3, h, w), dtype=torch.uint8) for _ in range(2)],
                    data_samples=[DataSample().set_gt_label(1), DataSample().set_gt_label(3)])
        want = models[0].train_step(data, wrappers[0])['loss']
        got = compiled(data, wrappers[1])['loss']
        # the first step starts from equal weights; the second from weights one Adam step apart (below)
        torch.testing.assert_close(got, want, rtol=1e-4 if i == 0 else 1e-3, atol=1e-5)

    _reuses_dynamic_graph(run, [(64, 72), (72, 88)], reused_from=1)
    # Gradients that are zero up to rounding (a conv bias before a BatchNorm) become Adam steps of +-lr, so those
    # weights agree to 2 lr per step; most others elementwise.
    lr = cfg.optim_wrapper.optimizer.lr
    close = total = 0
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        assert (q - p).abs().max() <= 2 * 2.2 * lr, name
        close += torch.isclose(q, p, rtol=1e-4, atol=1e-6).sum().item()
        total += p.numel()
    assert close >= 0.95 * total  # 98% measured: Adam also amplifies rounding in small gradients


@pytest.mark.parametrize('backend', COMPILE_BACKENDS)
def test_backbone_inference_compiles_and_equals_eager(backend):
    """eval() under inference_mode (the inference-only paths of the layers, e.g. RoPE in the projections'
    storage in eager mode) compiles and equals eager; RMT: its criss-cross and whole attention."""
    torch.manual_seed(0)
    model = BACKBONES['RMT']().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        got, want = compiled(x), model(x)
    _assert_close(got, want, 'RMT inference output')


def _op_inputs(h, w, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, h, w, 8, generator=g) for _ in range(3))
    la, lb = (-torch.rand(2, 2, h, w, generator=g) for _ in range(2))
    log_decay = -torch.rand(2, generator=g)
    return q, k, v, la, lb, log_decay


def _op(name: str, fixed_decay: bool = False, **kwargs):
    """The op ``name`` on its torch path as a function of (q, k, v, la, lb, log_decay)."""
    return lambda q, k, v, la, lb, log_decay: getattr(ops, name)(
        q, k, v, *((log_decay, ) if fixed_decay else (la, lb)), impl='torch', **kwargs)


OPS = {'ppma_attention': _op('ppma_attention'), 'ppma_attention_paper': _op('ppma_attention', form='paper'),
       'manhattan_attention': _op('manhattan_attention', True), 'criss_cross_attention': _op('criss_cross_attention'),
       'rmt_criss_cross_attention': _op('rmt_criss_cross_attention', True),
       'ppma_linear_attention': _op('ppma_linear_attention', feature_map='elu', normalize=True, chunk=4)}


WHOLE_OPS = ('ppma_attention', 'manhattan_attention')
# every op with autograd recording and without; whole attention also in its blockwise branch (autograd
# recording, above SMALL_ELEMENTS), which like its inference branch is the torch.library op
OP_RUNS = [(op, grad) for op in OPS for grad in ('autograd', 'inference')] + [(op, 'blockwise') for op in WHOLE_OPS]


@pytest.mark.parametrize('op, branch', OP_RUNS)
def test_torch_path_ops_trace_without_graph_breaks(op, branch, monkeypatch):
    if branch == 'blockwise':
        monkeypatch.setattr(whole_torch, 'SMALL_ELEMENTS', 0)
        monkeypatch.setattr(whole_torch, 'BLOCK_ELEMENTS', 64)
    inputs = [t.requires_grad_(branch != 'inference') for t in _op_inputs(5, 7)]
    torch._dynamo.reset()
    explained = torch._dynamo.explain(OPS[op])(*inputs)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    code = '\n'.join(graph.code for graph in explained.graphs)
    uses_library_op = op in WHOLE_OPS and branch in ('blockwise', 'inference')
    assert ('mmppma.whole_attention_blockwise' in code) == uses_library_op


@pytest.mark.parametrize('backend', COMPILE_BACKENDS)
@pytest.mark.parametrize('op', ['ppma_attention', 'manhattan_attention'])
def test_blockwise_branch_compiles_with_dynamic_shapes_and_equals_eager(op, backend, monkeypatch):
    monkeypatch.setattr(whole_torch, 'SMALL_ELEMENTS', 0)
    monkeypatch.setattr(whole_torch, 'BLOCK_ELEMENTS', 64)
    fn = OPS[op]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    for h, w in [(5, 7), (6, 9)]:
        leaves = _op_inputs(h, w, seed=h)
        results = []
        for run in (compiled, fn):
            xs = [t.clone().requires_grad_() for t in leaves]
            out = run(*xs)
            out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
            results.append([out.detach()] + [x.grad for x in xs if x.grad is not None])
        _assert_close(results[0], results[1], f'{op} {h}x{w}')


def test_blockwise_ops_return_the_strides_of_their_fake_impls():
    """Compiled code asserts a custom op's output strides against its fake impl (contiguous): with q, k, v
    permuted views of token-layout tensors (B, N, heads, d), as the layers hand them over, the real ops'
    outputs are contiguous too (a training step of PPMA-T at 512x768 runs the blockwise branch)."""
    from mmppma.ops.whole.torch_impl import whole_attention_blockwise, whole_attention_blockwise_backward
    g = torch.Generator().manual_seed(0)
    b, heads, h, w, d = 1, 2, 3, 4, 8
    q, k, v = (torch.randn(b, h * w, heads, d, generator=g).transpose(1, 2) for _ in range(3))
    sa, sb = -torch.rand(b, heads, h, w, w, generator=g), -torch.rand(b, heads, w, h, h, generator=g)
    out = whole_attention_blockwise(q, k, v, sa, sb, 'release')
    grads = whole_attention_blockwise_backward(torch.randn_like(out), q, k, v, sa, sb, 'release', True)
    assert out.is_contiguous() and all(t.is_contiguous() for t in grads), [t.stride() for t in (out, *grads)]
    torch.library.opcheck(whole_attention_blockwise_backward, (torch.randn_like(out), q, k, v, sa, sb, 'release',
                                                               True))
