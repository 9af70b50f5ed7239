"""Whole backbones on the simulated GPU (``MMPPMA_SIMULATE_CUDA``): with ``impl='auto'`` every mmppma op launches its
kernels, and each model equals its ``impl='torch'`` twin in training, no_grad, inference_mode, CPU autocast (standing
for CUDA's) and TF32 (the interpreter's dots are exact: the kernels must be asked for TF32), for every mask and form;
the tiny classification config evaluates through mmengine."""
import contextlib

import pytest
import torch

from ..conftest import REPO_ROOT, forget_preflight
from ..ops.oracle import tf32
from .conftest import DECAY_KERNELS as DECAYS
from .conftest import LINE_KERNELS as LINE
from .conftest import LINEAR_KERNELS as LINEAR
from .conftest import NO_FALLBACK, TWO_STAGES, TWO_WHOLE_STAGES_ARCH, WHOLE_KERNELS, require
from .conftest import TWO_STAGE_ARCH as ARCH

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
if torch.cuda.is_available():
    pytest.skip('the simulated GPU runs CPU tensors on the interpreter (a GPU is here)', allow_module_level=True)

from mmppma.ops.triton_support import launch  # noqa: E402

pytestmark = NO_FALLBACK
#: variant -> (the backbone for an impl, the kernels a training step launches); PPMA's mask 'none' attends in its
#: whole stage with SDPA, form 'paper' (whole stages only) with the torch path (its decay tables on the kernels)
MODELS = {
    'PPMA': (TWO_STAGES['PPMA'], LINE | WHOLE_KERNELS | DECAYS),
    'PPMA-paper': (lambda impl: TWO_STAGES['PPMA'](impl, TWO_WHOLE_STAGES_ARCH, form='paper'), DECAYS),
    'PPMA-v2h': (lambda impl: TWO_STAGES['PPMA'](impl, form='v2h'), LINE | WHOLE_KERNELS | DECAYS),
    **{f'PPMA-{mask}': (lambda impl, mask=mask: TWO_STAGES['PPMA'](impl, mask=mask), kernels)
       for mask, kernels in (('shared', LINE | WHOLE_KERNELS | DECAYS), ('none', LINE))},
    'RMT': (TWO_STAGES['RMT'], LINE | WHOLE_KERNELS),
    'PPMLA': (TWO_STAGES['PPMLA'], LINEAR),
    'VMINet': (TWO_STAGES['VMINet'], set()),
}


#: mode -> (a training step, else an evaluation; the context of the step; autocast dtype of the forward; the
#: tolerance in relative norm per tensor beyond twice the torch path's own error in that mode)
MODES = {
    'train': (True, contextlib.nullcontext, None, 1e-4),
    'no_grad': (False, torch.no_grad, None, 1e-4),
    'inference_mode': (False, torch.inference_mode, None, 1e-4),
    'fp16': (True, contextlib.nullcontext, torch.float16, 1e-2),
    'bf16': (True, contextlib.nullcontext, torch.bfloat16, 1e-2),
    'allow_tf32': (True, lambda: tf32(True, 'allow_tf32'), None, 1e-2),
    'fp32_precision': (True, lambda: tf32(True, 'matmul'), None, 1e-2),
}
# the default tier: every variant, mode and capability once; --all: every variant in every mode, sm_90, larger
CASES = [('PPMA', 'train', 90), ('PPMA', 'no_grad', 89), ('PPMA-paper', 'fp16', 80), ('PPMA-shared', 'bf16', 86),
         ('PPMA-v2h', 'allow_tf32', 120), ('PPMA-none', 'fp32_precision', 100), ('RMT', 'train', 86),
         ('RMT', 'inference_mode', 80), ('PPMLA', 'train', 80), ('VMINet', 'train', 90)]
HEAVY = [pytest.param(name, mode, 90, marks=pytest.mark.heavy, id=f'{name}-{mode}-90-large')
         for name in MODELS for mode in MODES]


def run_model(model, mode: str, x):
    """Outputs, and in a training step the parameters' gradients of a fixed linear functional of them."""
    train, context, dtype, _ = MODES[mode]
    model.train(train)
    with context():
        with torch.autocast('cpu', dtype=dtype) if dtype else contextlib.nullcontext():
            outs = model(x)
        if not train:
            return [o.clone() for o in outs]
        loss = sum((o.float() * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)
        params = [p for p in model.parameters() if p.requires_grad]
        return [o.detach() for o in outs] + list(torch.autograd.grad(loss, params))


#: the precision recorded for a kernel without dot products (the decay tables')
NO_PRODUCTS = 'no products'


@pytest.fixture
def launched(monkeypatch):
    """The (kernel name, dot precision) of every launch the test runs; earlier preflight verdicts forgotten."""
    forget_preflight()
    seen = set()
    call = launch.Launch.__call__

    def record(self):
        seen.add((self.name, self.constexprs.get('PRECISION', NO_PRODUCTS)))
        call(self)

    monkeypatch.setattr(launch.Launch, '__call__', record)
    return seen


@pytest.mark.parametrize('name, mode, cap', CASES + HEAVY)
def test_model_on_simulated_gpu_equals_torch(name, mode, cap, request, launched, monkeypatch):
    build, kernels = MODELS[name]
    train, _, dtype, tol = MODES[mode]
    size = (32, 48) if request.node.get_closest_marker('heavy') else (16, 24)
    x = torch.randn(1, 3, *size)
    want_model = build('torch')
    want = run_model(want_model, mode, x)
    got_model = build('auto')
    got_model.load_state_dict(want_model.state_dict())
    monkeypatch.setenv('MMPPMA_SIMULATE_CUDA', str(cap))
    with launch.executed() as ran:
        got = run_model(got_model, mode, x)

    assert {k for k, _ in launched} == (kernels if train else {k for k in kernels if 'bwd' not in k})
    assert {c for c, _ in ran} == ({cap} if kernels else set())  # the launch table of the simulated capability
    tf32_on = mode in ('allow_tf32', 'fp32_precision')
    # dot precisions: half inputs take triton's default (None); PPMLA scans float32 under autocast too
    assert {p for _, p in launched if p != NO_PRODUCTS} <= ({'tf32'} if tf32_on else {None, 'ieee'} if dtype else
                                                          {'ieee'}), launched
    assert_like_torch(f'{name} {mode}', got, want, run_model(want_model, 'train' if train else 'no_grad', x), tol)


def assert_like_torch(what: str, got, want, exact, tol: float) -> None:
    """Each of ``got`` within twice the torch path's own error (``want`` against ``exact``, the torch path in
    float32: on the CPU it takes no TF32, and autocast's rounding is measured against it) plus ``tol`` in relative
    norm."""
    assert len(got) == len(want), (len(got), len(want))
    norms = [e.double().norm().item() for e in exact]
    floor = 1e-2 * max(norms)  # the gradients of biases before a BatchNorm are rounding noise
    for i, (g, w, e, n) in enumerate(zip(got, want, exact, norms)):
        err, own = ((t.double() - e.double()).norm().item() for t in (g, w))
        assert err <= 2 * own + tol * max(n, floor), \
            f'{what} tensor {i} {tuple(e.shape)}: error {err:.3g}, the torch path\'s {own:.3g}, norm {n:.3g}'


def test_tiny_classification_config_evaluates_on_the_simulated_gpu(tmp_path, run_python, launched, monkeypatch):
    """mmengine's validation loop of configs/tiny/ppma_t_tiny_in.py: the kernels run, metrics equal the torch path's."""
    require('mmpretrain.datasets')
    require('mmpretrain.evaluation')
    from mmengine.config import Config
    from mmengine.runner import Runner

    from mmppma.utils import register_scope_modules
    run_python([REPO_ROOT / 'tools' / 'make_tiny_datasets.py', '--out', tmp_path, '--tasks', 'imagenet',
                '--imagenet-train', '1', '--imagenet-val', '1'])
    monkeypatch.setenv('MMPPMA_TINY_DATA', str(tmp_path))
    cfg = Config.fromfile(REPO_ROOT / 'configs' / 'tiny' / 'ppma_t_tiny_in.py')
    cfg.model.backbone.update(arch=ARCH, out_indices=(1, ))
    cfg.model.head.in_channels = ARCH['embed_dims'][-1]
    _, resize, crop, _ = cfg.val_dataloader.dataset.pipeline
    resize.scale, crop.crop_size = 32, 32
    cfg.work_dir = str(tmp_path / 'work')
    register_scope_modules(cfg.default_scope)
    runner = Runner.from_cfg(cfg)
    want = runner.val()
    assert not launched
    monkeypatch.setenv('MMPPMA_SIMULATE_CUDA', '86')
    got = runner.val()
    assert {name for name, _ in launched} == {'_line_fwd', '_whole_fwd', '_tables_fwd'}
    assert 0 <= got['accuracy/top1'] <= 100 and got == want


@pytest.mark.heavy  # about a minute on the interpreter: the walks' row sweeps; the ops' tests cover the kernels
def test_ppmla_in_chunks_on_simulated_gpu_equals_torch(launched, monkeypatch):
    """PPMLA with the chunked form forced (chunks of 2 rows, so both stages walk): a bf16 autocast training step
    launches the chunked form's kernels, forward and backward, on half inputs, and equals the torch path."""
    from mmppma import ops
    from mmppma.ops.linear import chunked_triton, triton_impl
    monkeypatch.setattr(triton_impl, 'runs_chunked', lambda *args, **kwargs: True)
    monkeypatch.setattr(chunked_triton, 'CHUNK_ROWS', 2)
    build, _ = MODELS['PPMLA']
    x = torch.randn(1, 3, 16, 24)
    want_model = build('torch')
    got_model = build('auto')
    got_model.load_state_dict(want_model.state_dict())
    monkeypatch.setenv('MMPPMA_SIMULATE_CUDA', '90')
    ops.clear_caches()  # the plans chosen before the patch
    try:
        got = run_model(got_model, 'bf16', x)
    finally:
        ops.clear_caches()
    want = run_model(want_model, 'bf16', x)
    assert {k for k, _ in launched} == {'_queries', '_update', '_grad_queries', '_grad_keys', '_update_queries'}
    assert_like_torch('PPMLA in chunks bf16', got, want, run_model(want_model, 'train', x), MODES['bf16'][-1])
