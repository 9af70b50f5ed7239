"""The simulated GPU (``MMPPMA_SIMULATE_CUDA``): CPU tensors take the CUDA code path of a capability - impl
resolution, the preflight, the launch table of that capability - with the kernels on Triton's interpreter."""
import pytest
import torch

from mmppma import ops
from mmppma.ops import dispatch
from mmppma.ops.dispatch import resolve_impl

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
if torch.cuda.is_available():
    pytest.skip('the simulated device runs CPU tensors on the interpreter (no GPU here)', allow_module_level=True)

from mmppma.ops.triton_support import launch as lp  # noqa: E402


def inputs(b=1, heads=1, h=5, w=7, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(b, heads, h, w, d, generator=g).requires_grad_() for _ in range(3)] +
            [(-torch.rand(b, heads, h, w, generator=g)).requires_grad_() for _ in range(2)])


def launched(monkeypatch):
    """The list every launch the ops run from now on on CPU tensors is appended to (and still run); the preflight's
    launches on meta tensors are left out."""
    ran, run = [], lp.run
    monkeypatch.setattr(lp, 'run', lambda launches: run(
        ran.extend(x for x in launches if x.args[0].device.type == 'cpu') or launches))
    return ran


def describe(launch):
    return launch.name, launch.grid, launch.constexprs, launch.config


def test_without_the_switch_nothing_changes(monkeypatch):
    monkeypatch.delenv(dispatch.SIMULATE_VAR, raising=False)
    x = torch.zeros(1)
    assert not dispatch.on_gpu(x) and lp.capability(x.device) == 0
    assert resolve_impl('auto', 'ppma_attention', [x]) == 'torch'


@pytest.mark.parametrize('cap', dispatch.CAPABILITIES)
def test_cpu_tensors_take_the_cuda_path_of_the_capability(cap, monkeypatch):
    """'auto' resolves to triton, and a call launches what tools/check_kernels.py records (and compiles) for that
    capability on meta tensors, not the interpreter's one configuration; the result equals the reference."""
    monkeypatch.setenv(dispatch.SIMULATE_VAR, str(cap))
    x = torch.zeros(1)
    assert dispatch.on_gpu(x) and lp.capability(x.device) == cap and dispatch.device_capability(x.device) == cap
    assert resolve_impl('auto', 'ppma_attention', [x]) == 'triton'
    assert resolve_impl('auto', 'decay_scan_1d', [x]) == 'triton'
    ran = launched(monkeypatch)
    q, k, v, la, lb = inputs()
    out = ops.ppma_attention(q, k, v, la, lb, impl='auto')
    out.backward(torch.ones_like(out))
    meta = [t.detach().to('meta').requires_grad_() for t in (q, k, v, la, lb)]
    with lp.recording(cap) as recorded:
        meta_out = ops.ppma_attention(*meta, impl='triton')
        torch.autograd.grad(meta_out, meta, torch.empty_like(meta_out))
    assert [describe(x) for x in ran] == [describe(x) for x in recorded]
    assert lp.config('whole_fwd', 35, torch.float32, 0) not in {x.config for x in ran}  # not the interpreter's
    want = ops.ppma_attention(*(t.detach().double() for t in (q, k, v, la, lb)), impl='reference')
    torch.testing.assert_close(out.detach().double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('value', ['75', 'sm_90', '9.0'])
def test_other_capabilities_are_refused_by_name(value, monkeypatch):
    monkeypatch.setenv(dispatch.SIMULATE_VAR, value)
    with pytest.raises(ValueError, match='MMPPMA_SIMULATE_CUDA.*80, 86, 89, 90'):
        ops.ppma_attention(*inputs(), impl='auto')


def test_the_switch_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv(dispatch.SIMULATE_VAR, '90')
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    with pytest.raises(RuntimeError, match='TRITON_INTERPRET=1'):
        ops.ppma_attention(*inputs(), impl='auto')
