"""The backbones under float16 and bfloat16 autocast, on CPU (the torch path) and on the simulated GPU (the
kernels): finite outputs and gradients; outputs within 1e-2 (float16) / 3e-2 (bfloat16) of float32 in relative norm,
all parameter gradients together within twice that."""
import pytest
import torch

from mmppma.ops import devices

from .conftest import TWO_STAGES, TWO_WHOLE_STAGES_ARCH

#: variant -> builder taking impl: PPMA with each mask and form, RMT, MLLA, PPMLA, VMINet
VARIANTS = {
    **{name: TWO_STAGES[name] for name in ('PPMA', 'RMT', 'MLLA', 'PPMLA')},
    'PPMA-paper': lambda impl: TWO_STAGES['PPMA'](impl, TWO_WHOLE_STAGES_ARCH, form='paper'),
    'PPMA-v2h': lambda impl: TWO_STAGES['PPMA'](impl, form='v2h'),
    **{f'PPMA-{mask}': (lambda impl, mask=mask: TWO_STAGES['PPMA'](impl, mask=mask)) for mask in ('shared', 'none')},
    'VMINet': lambda impl: TWO_STAGES['VMINet'](),
}
DTYPES = {'fp16': torch.float16, 'bf16': torch.bfloat16}
#: relative-norm tolerance against float32 of every output; all gradients together take twice it (the backward
#: rounds again; one parameter alone is no measure: one whose exact gradient is zero, such as a bias before a
#: BatchNorm, has only rounding noise in either precision)
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2}


def step(model, x, dtype):
    """Outputs and all parameter gradients (concatenated) of one training step of a loss that weighs every output
    element alike (the mean square), under autocast to ``dtype``."""
    model.zero_grad()
    with torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        outs = model(x)
    sum(o.float().square().mean() for o in outs).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return [o.detach().float() for o in outs], grads


def relative(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def check_half_precision(name, dtype, monkeypatch, simulate=None):
    """The variant's float32 step on the torch path, against its half-precision step: on the torch path, or with
    ``simulate`` (a capability) through impl='auto' on that simulated GPU, with the same weights."""
    torch.manual_seed(0)
    model = VARIANTS[name]('torch')
    x = torch.randn(1, 3, 32, 44)  # stage maps 8 x 11 and 4 x 5
    outs, grads = step(model, x, None)
    if simulate:
        monkeypatch.setenv(devices.SIMULATE_VAR, str(simulate))
        on_gpu = VARIANTS[name]('auto')
        on_gpu.load_state_dict(model.state_dict())
        model = on_gpu
    half_outs, half_grads = step(model, x, dtype)
    assert all(torch.isfinite(o).all() for o in half_outs) and torch.isfinite(half_grads).all()
    errors = [relative(h, f) for h, f in zip(half_outs, outs)]
    assert max(errors) <= TOLERANCE[dtype], errors
    assert relative(half_grads, grads) <= 2 * TOLERANCE[dtype], relative(half_grads, grads)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', VARIANTS)
def test_autocast_on_cpu_stays_finite_and_near_float32(name, dtype, monkeypatch):
    monkeypatch.delenv(devices.SIMULATE_VAR, raising=False)
    check_half_precision(name, DTYPES[dtype], monkeypatch)


# the default tier: every variant once on the simulated sm_90, the dtypes alternating; --all: both dtypes
SIMULATED = [pytest.param(name, dtype, marks=[] if (i + (dtype == 'bf16')) % 2 else [pytest.mark.heavy])
             for i, name in enumerate(VARIANTS) for dtype in DTYPES]


@pytest.mark.parametrize('name, dtype', SIMULATED)
def test_autocast_on_the_simulated_gpu_stays_finite_and_near_float32(name, dtype, monkeypatch):
    pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
    if torch.cuda.is_available():
        pytest.skip('the simulated GPU runs CPU tensors on the interpreter (a GPU is here)')
    check_half_precision(name, DTYPES[dtype], monkeypatch, simulate=90)
