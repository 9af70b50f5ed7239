"""``torch.compile`` as mmengine's ``compile=True`` calls it (the ops: tests/ops/test_library.py): the backbones
trace without graph breaks; a classifier's train step traces on ``aot_eager``, one block compiles on inductor, each
reusing its dynamic graph; the full tier compiles whole backbones on inductor at three sizes."""
import os

import pytest
import torch
import torch._dynamo

from mmppma.models.backbones import PPMA

from ..conftest import COMPILE_BACKENDS
from ..ops.oracle import graph_code
from .conftest import TWO_STAGE_ARCH
from .conftest import TWO_STAGES as BACKBONES

# the first compiles static shapes, the second recompiles with dynamic ones, the third runs the dynamic graph
SIZES = [(64, 64), (96, 128), (128, 96)]


def _step(model, module, x):
    """Outputs and parameter gradients of a fixed linear functional of the outputs."""
    outs = module(x)
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)
    params = [p for p in model.parameters() if p.requires_grad]
    return [o.detach() for o in outs], list(torch.autograd.grad(loss, params))


def _assert_close(got, want, what):
    """max |got - want| <= 1e-4 * max |want| per tensor, at least 1e-1 of the largest (a bias before a BatchNorm has
    a gradient that is zero up to the rounding of sums as large as the largest gradients)."""
    floor = 1e-1 * max(w.abs().max().item() for w in want)
    for i, (g, w) in enumerate(zip(got, want)):
        scale = max(w.abs().max().item(), floor)
        err = (g - w).abs().max().item()
        assert err <= 1e-4 * scale, f'{what} {i}: max abs error {err:.3g}, scale {scale:.3g}'


@pytest.mark.parametrize('name', list(BACKBONES))
def test_backbone_traces_without_graph_breaks(name):
    code = graph_code(BACKBONES[name]().train(), torch.randn(2, 3, 64, 96))
    # every conv is the mmppma::conv2d op (an aten conv would pin a dynamic graph's sizes on CPU)
    assert 'mmppma.conv2d' in code
    assert 'torch.conv2d' not in code and 'aten.convolution' not in code


# One inductor compile costs minutes on 2 cores: PPMA only, unless MMPPMA_COMPILE_ALL=1.
DYNAMIC = list(BACKBONES) if os.environ.get('MMPPMA_COMPILE_ALL') else ['PPMA']


def _reuses_dynamic_graph(run, sizes, reused_from: int = 2) -> None:
    """``run(i, h, w)`` at each size; a recompile from size ``reused_from`` on is an error (1: ``dynamic=True``)."""
    for i, (h, w) in enumerate(sizes):
        with torch._dynamo.config.patch(error_on_recompile=i >= reused_from):
            run(i, h, w)


@pytest.mark.heavy
@pytest.mark.slow(minutes=12)
@pytest.mark.parametrize('name', DYNAMIC)
def test_backbone_compiles_with_dynamic_shapes_and_equals_eager(name):
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
    """One PPMA block (depthwise convs, no mask) on inductor with dynamic shapes, forward and backward: its convs, the
    mmppma::conv2d op, do not pin the dynamic graph's sizes, so the second size runs the first one's graph."""
    model = PPMA(arch=dict(embed_dims=[16], depths=[1], num_heads=[2], mlp_ratios=[2], attn_types=['whole']),
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


@pytest.mark.heavy  # (the default tier: tests/engine/test_paramwise_constructor.py traces the update's function)
@pytest.mark.slow(minutes=2)
def test_classifier_train_step_traces_on_aot_eager_and_reuses_its_dynamic_graph():
    """The tiny classification config's whole train step (preprocessor to optimizer update) compiled as mmengine's
    ``compile=dict(backend='aot_eager', dynamic=True)``: a second size reuses the graph, steps equal eager's (the full
    tier: over a minute of tracing)."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmpretrain.apis import get_model
    from mmpretrain.structures import DataSample
    cfg = Config.fromfile(os.path.join(os.path.dirname(__file__), '../../configs/tiny/ppma_t_tiny_in.py'))
    cfg.model.backbone.update(arch=TWO_STAGE_ARCH, out_indices=(1, ))  # a criss-cross and a whole-attention block
    cfg.model.head.in_channels = TWO_STAGE_ARCH['embed_dims'][-1]
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
    """RMT's eval() under inference_mode (the layers' inference-only paths) compiles and equals eager."""
    model = BACKBONES['RMT']().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        got, want = compiled(x), model(x)
    _assert_close(got, want, 'RMT inference output')
