"""The kernels' dot precision follows torch's TF32 setting for CUDA matmuls, set through the legacy flag
(``torch.backends.cuda.matmul.allow_tf32``) or the ``fp32_precision`` API; every test restores torch's settings."""
import pytest
import torch

from mmppma import ops

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
from mmppma.ops.triton_support import launch as lp  # noqa: E402

NEW_API = hasattr(torch.backends, 'fp32_precision')


@pytest.fixture(autouse=True)
def restore_tf32():
    """Put torch's TF32 settings back as they were (through the new API where torch has it: once that was used,
    reading the legacy flag raises)."""
    if NEW_API:
        saved = torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision
        yield
        torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision = saved
    else:
        saved = torch.backends.cuda.matmul.allow_tf32
        yield
        torch.backends.cuda.matmul.allow_tf32 = saved


def set_legacy(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on


def set_matmul(on: bool) -> None:
    torch.backends.cuda.matmul.fp32_precision = 'tf32' if on else 'ieee'


def set_generic(on: bool) -> None:  # every backend's default; matmul inherits it while its own is 'none'
    torch.backends.cuda.matmul.fp32_precision = 'none'
    torch.backends.fp32_precision = 'tf32' if on else 'ieee'


SETTERS = [set_legacy] + ([set_matmul, set_generic] if NEW_API else [])


@pytest.mark.parametrize('setter', SETTERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize('on', [True, False], ids=['on', 'off'])
def test_float32_precision_follows_tf32_setting(setter, on):
    setter(on)
    assert lp.precision(torch.float32) == ('tf32' if on else 'ieee')
    for dtype in (torch.float16, torch.bfloat16):  # triton's default: tensor cores, float32 accumulation
        assert lp.precision(dtype) is None


@pytest.mark.skipif(not NEW_API, reason='torch has no fp32_precision API')
def test_legacy_flag_then_new_api_then_legacy_flag():
    """Switching between the two APIs: the last setting wins, and reading it never raises."""
    set_legacy(True)
    assert lp.precision(torch.float32) == 'tf32'
    set_matmul(False)
    assert lp.precision(torch.float32) == 'ieee'
    set_matmul(True)
    assert lp.precision(torch.float32) == 'tf32'
    set_legacy(False)
    assert lp.precision(torch.float32) == 'ieee'


@pytest.mark.parametrize('setter', SETTERS, ids=lambda f: f.__name__)
def test_launches_take_tf32_when_it_is_on(setter, monkeypatch):
    """Every launch of the float32 ops (forward and backward, recorded for sm_90 on meta tensors) compiles with
    PRECISION='tf32' when TF32 is on and 'ieee' when it is off."""
    monkeypatch.setattr('mmppma.ops.dispatch.triton_interpreted', lambda: True)  # impl='triton' takes meta tensors
    q, k, v = (torch.empty(1, 2, 8, 8, 16, device='meta', requires_grad=True) for _ in range(3))
    la, lb = (torch.empty(1, 2, 8, 8, device='meta', requires_grad=True) for _ in range(2))
    calls = [lambda: ops.ppma_attention(q, k, v, la, lb, impl='triton'),
             lambda: ops.criss_cross_attention(q, k, v, la, lb, impl='triton'),
             lambda: ops.ppma_linear_attention(q, k, v, la, lb, impl='triton')]
    for on in (True, False):
        setter(on)
        for call in calls:
            with lp.recording(90) as launches:
                out = call()
                torch.autograd.grad(out, (q, k, v, la, lb), torch.empty_like(out), allow_unused=True)
            assert launches and {x.constexprs['PRECISION'] for x in launches} == {'tf32' if on else 'ieee'}
