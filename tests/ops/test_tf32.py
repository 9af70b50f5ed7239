"""The kernels' dot precision follows torch's TF32 setting for CUDA matmuls, set through the legacy flag
(``torch.backends.cuda.matmul.allow_tf32``) or the ``fp32_precision`` API; every test restores torch's settings."""
import pytest
import torch

from mmppma import ops

from .oracle import set_tf32, tf32

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
from mmppma.ops.triton_support import launch as lp  # noqa: E402

NEW_API = hasattr(torch.backends, 'fp32_precision')
APIS = ['allow_tf32'] + (['matmul', 'generic'] if NEW_API else [])


@pytest.fixture(autouse=True)
def restore_tf32():
    with tf32():
        yield


@pytest.mark.parametrize('api', APIS)
def test_precision_and_launches_follow_the_tf32_setting(api, monkeypatch):
    """lp.precision: float32 'tf32' / 'ieee', half None (tensor cores, float32 accumulation); every launch of the
    float32 ops (forward and backward, recorded for sm_90 on meta tensors) compiles with that PRECISION."""
    monkeypatch.setattr('mmppma.ops.plan.triton_interpreted', lambda: True)  # impl='triton' takes meta tensors
    q, k, v = (torch.empty(1, 2, 8, 8, 16, device='meta', requires_grad=True) for _ in range(3))
    la, lb = (torch.empty(1, 2, 8, 8, device='meta', requires_grad=True) for _ in range(2))
    for on in (True, False):
        set_tf32(api, on)
        assert lp.precision(torch.float32) == ('tf32' if on else 'ieee')
        assert lp.precision(torch.float16) is lp.precision(torch.bfloat16) is None
        for op in (ops.ppma_attention, ops.criss_cross_attention, ops.ppma_linear_attention):
            with lp.recording(90) as launches:
                out = op(q, k, v, la, lb, impl='triton')
                torch.autograd.grad(out, (q, k, v, la, lb), torch.empty_like(out), allow_unused=True)
            assert launches and {x.constexprs['PRECISION'] for x in launches} == {'tf32' if on else 'ieee'}


@pytest.mark.skipif(not NEW_API, reason='torch has no fp32_precision API')
def test_legacy_flag_then_new_api_then_legacy_flag():
    """Switching between the two APIs: the last setting wins, and reading it never raises."""
    for api, on in (('allow_tf32', True), ('matmul', False), ('matmul', True), ('allow_tf32', False)):
        set_tf32(api, on)
        assert lp.precision(torch.float32) == ('tf32' if on else 'ieee')


@pytest.mark.parametrize('api', APIS)
def test_tf32_matmuls_sets_then_restores_the_setting(api):
    """lp.tf32_matmuls (the tools' switch) turns TF32 on / off within its block whatever API set it before, and
    restores that setting after it."""
    for before in (True, False):
        set_tf32(api, before)
        for on in (True, False):
            with lp.tf32_matmuls(on):
                assert lp.precision(torch.float32) == ('tf32' if on else 'ieee')
            assert lp.precision(torch.float32) == ('tf32' if before else 'ieee')
