"""The simulated GPU (``MMPPMA_SIMULATE_CUDA``): CPU tensors take the CUDA code path of a capability - impl
resolution, the preflight, the launch table of that capability - with the kernels on Triton's interpreter."""
import pytest
import torch

from mmppma import ops
from mmppma.ops import dispatch
from mmppma.ops.dispatch import resolve_impl

from . import oracle

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
if torch.cuda.is_available():
    pytest.skip('the simulated device runs CPU tensors on the interpreter (no GPU here)', allow_module_level=True)

from mmppma.ops.triton_support import launch as lp  # noqa: E402


def inputs(h=5, w=7):
    return oracle.leaf(*oracle.inputs(1, 1, h, w, 16, dtype=torch.float32))


def launched(monkeypatch):
    """The list every launch the ops run from now on on CPU tensors is appended to (and still run); the preflight's
    launches on meta tensors are left out."""
    ran, run = [], lp.run
    monkeypatch.setattr(lp, 'run', lambda launches: run(
        ran.extend(x for x in launches if x.args[0].device.type == 'cpu') or launches))
    return ran


def describe(launch):
    return launch.name, launch.grid, launch.signature(), launch.constexprs, launch.config


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


def _case(op):
    """(call(*inputs, impl), inputs) of ``op`` at a tiny shape."""
    q, k, v, la, lb = oracle.inputs(1, 2, 3, 4, 4, seed=3, dtype=torch.float32)
    log_decay = torch.tensor([-0.2, -0.6])
    return {
        'ppma_attention': (ops.ppma_attention, [q, k, v, la, lb]),
        'criss_cross_attention': (ops.criss_cross_attention, [q, k, v, la, lb]),
        'manhattan_attention': (ops.manhattan_attention, [q, k, v, log_decay]),
        'rmt_criss_cross_attention': (ops.rmt_criss_cross_attention, [q, k, v, log_decay]),
        'decay_scan_1d': (ops.decay_scan_1d, [torch.randn(2, 5, 3), -torch.rand(2, 5)]),
        'polyline_mask_matvec': (lambda *t, impl: ops.polyline_mask_matvec(*t, form='2d', impl=impl), [v, la, lb]),
        'polyline_mask_matvec_3d': (ops.polyline_mask_matvec_3d, [torch.randn(1, 1, 2, 3, 4, 3)] +
                                    [-torch.rand(1, 1, 2, 3, 4) for _ in range(3)]),
        'ppma_linear_attention': (lambda *t, impl: ops.ppma_linear_attention(*t, feature_map='elu', normalize=True,
                                                                             impl=impl), [q, k, v, la, lb]),
        'ppma_decomposed_attention': (ops.ppma_decomposed_attention, [q, k, v, la, lb]),
    }[op]


GRAD_MODES = {'grad': torch.enable_grad, 'no_grad': torch.no_grad, 'inference_mode': torch.inference_mode}


def _inject(kind, monkeypatch):
    """Make every launch fail as ``kind`` does on a GPU: a Triton error (out of shared memory, or a compile error: a
    launch compiles and loads first), a driver error, or grids over CUDA's limits."""
    from triton.runtime.errors import OutOfResources

    def fail(self):
        if kind == 'triton':
            raise OutOfResources(300000, 232448, 'shared memory')
        raise RuntimeError('CUDA driver error: invalid argument')

    if kind == 'grid':
        monkeypatch.setattr(lp, 'GRID_LIMITS', (0, 0, 0))
    else:
        monkeypatch.setattr(lp.Launch, '__call__', fail)


FAILURES = {'triton': 'OutOfResources', 'driver': 'RuntimeError: CUDA driver error', 'grid': 'LaunchLimitError'}


def assert_one_fallback_warning(record, op, args, kind):
    """Exactly one of the recorded warnings is the fallback's, naming the op, shape, dtype, GPU and failure."""
    messages = [str(w.message) for w in record if 'Triton kernels cannot run' in str(w.message)]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f'{op}: ') and 'simulated sm_90' in messages[0], messages[0]
    assert str(tuple(args[0].shape)) in messages[0] and 'torch.float32' in messages[0], messages[0]
    assert FAILURES[kind] in messages[0], messages[0]


@pytest.mark.parametrize('kind', FAILURES)
@pytest.mark.parametrize('op', list(dispatch.IMPLEMENTATIONS))
def test_auto_falls_back_to_torch_with_one_warning_when_kernels_cannot_run(op, kind, monkeypatch):
    """On the simulated sm_90 every launch fails; in each grad mode impl='auto' returns the torch path's result with
    one warning naming the op, shape, dtype and GPU (once per input signature); impl='triton' raises naming them
    and impl='torch'."""
    from mmppma.ops.triton_support import preflight
    monkeypatch.setenv(dispatch.SIMULATE_VAR, '90')
    _inject(kind, monkeypatch)
    call, args = _case(op)
    want = call(*args, impl='torch')
    for mode in GRAD_MODES.values():
        monkeypatch.setattr(preflight, '_PREFLIGHT', {})
        with mode(), pytest.warns(UserWarning) as record:
            got = [call(*args, impl='auto') for _ in range(2)]
        assert_one_fallback_warning(record, op, args, kind)
        for out in got:
            torch.testing.assert_close(out, want, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=rf"{op}: .*simulated sm_90.*{FAILURES[kind]}.*impl='torch'"):
        call(*args, impl='triton')


@pytest.mark.parametrize('op', list(dispatch.IMPLEMENTATIONS))
def test_a_failing_backward_launch_gives_the_torch_gradients(op, monkeypatch):
    """The preflight and the forward pass, then every backward launch fails: impl='auto' returns the torch path's
    gradients with one warning naming the op, shape, dtype and GPU, and its next calls take the torch path;
    impl='triton' raises naming them."""
    from mmppma.ops.triton_support import preflight
    monkeypatch.setenv(dispatch.SIMULATE_VAR, '90')
    monkeypatch.setattr(preflight, '_PREFLIGHT', {})
    call, args = _case(op)
    args = [t.requires_grad_() for t in args]
    want = call(*args, impl='torch')
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(5))
    outs = {impl: call(*args, impl=impl) for impl in ('auto', 'triton')}
    with monkeypatch.context() as m:
        _inject('driver', m)
        with pytest.warns(UserWarning) as record:
            got = torch.autograd.grad(outs['auto'], args, grad)
        assert_one_fallback_warning(record, op, args, 'driver')
        for g, w in zip(got, torch.autograd.grad(want, args, grad)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        torch.testing.assert_close(call(*args, impl='auto'), want, rtol=0, atol=0)  # no launch: it would fail
        with pytest.raises(RuntimeError, match=rf"{op}: .*simulated sm_90.*{FAILURES['driver']}.*impl='torch'"):
            torch.autograd.grad(outs['triton'], args, grad)


@pytest.mark.parametrize('mode', GRAD_MODES)
def test_the_preflight_runs_in_any_grad_mode_and_outside_inference_mode(mode, monkeypatch):
    """Under no_grad and inference_mode the kernels run (no fallback, no warning) and equal the reference; the
    preflight records its launches with autograd on, outside the caller's inference mode."""
    from mmppma.ops.triton_support import preflight
    monkeypatch.setenv(dispatch.SIMULATE_VAR, '90')
    monkeypatch.setattr(preflight, '_PREFLIGHT', {})
    modes, recording = [], lp.recording

    def recording_modes(cap):
        modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return recording(cap)

    monkeypatch.setattr(lp, 'recording', recording_modes)
    ran = launched(monkeypatch)
    args = [t.detach() for t in inputs(h=4, w=5)]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        with GRAD_MODES[mode]():
            out = ops.ppma_attention(*args, impl='auto')
    assert ran and modes and set(modes) == {(False, True)}, modes
    torch.testing.assert_close(out.double(), ops.ppma_attention(*(t.double() for t in args), impl='reference'),
                               rtol=1e-4, atol=1e-5)


def test_paper_form_takes_the_torch_path_on_the_gpu(monkeypatch):
    """Whole attention's paper form has no kernel: impl='auto' on the (simulated) GPU takes the torch path; an
    explicit impl='triton' names impl='torch'."""
    monkeypatch.setenv(dispatch.SIMULATE_VAR, '90')
    ran = launched(monkeypatch)
    args = [t.detach() for t in inputs()]
    assert resolve_impl('auto', 'ppma_attention', args, 'paper') == 'torch'
    assert resolve_impl('auto', 'ppma_attention', args, 'release') == 'triton'
    got = ops.ppma_attention(*args, form='paper', impl='auto')
    assert not ran
    torch.testing.assert_close(got, ops.ppma_attention(*args, form='paper', impl='torch'), rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="form='paper'.*impl='torch'"):
        ops.ppma_attention(*args, form='paper', impl='triton')
