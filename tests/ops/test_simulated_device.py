"""The simulated GPU (``MMPPMA_SIMULATE_CUDA``): CPU tensors take the CUDA code path of a capability - impl
resolution, the preflight, the launch table of that capability - with the kernels on Triton's interpreter."""
import pytest
import torch

from mmppma import ops
from mmppma.ops import devices, plan
from mmppma.ops.caches import registered
from mmppma.ops.plan import resolve_impl

from ..conftest import forget_preflight
from . import oracle
from .test_launches import DISTINCT_TABLES

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
    monkeypatch.delenv(devices.SIMULATE_VAR, raising=False)
    x = torch.zeros(1)
    assert not devices.on_gpu(x) and lp.capability(x.device) == 0
    assert resolve_impl('auto', 'ppma_attention', [x]) == 'torch'


def test_every_tabled_capability_resolves_to_the_kernels(monkeypatch):
    for cap in devices.CAPABILITIES:
        monkeypatch.setenv(devices.SIMULATE_VAR, str(cap))
        x = torch.zeros(1)
        assert devices.on_gpu(x) and lp.capability(x.device) == cap and devices.device_capability(x.device) == cap
        assert resolve_impl('auto', 'ppma_attention', [x]) == 'triton'
        assert resolve_impl('auto', 'decay_scan_1d', [x]) == 'triton'


@pytest.mark.parametrize('cap', DISTINCT_TABLES)
def test_cpu_tensors_take_the_cuda_path_of_the_capability(cap, monkeypatch):
    """A call launches what tools/check_kernels.py records (and compiles) for that capability on meta tensors, not
    the interpreter's one configuration; the result equals the reference. One capability per distinct table."""
    monkeypatch.setenv(devices.SIMULATE_VAR, str(cap))
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


@pytest.mark.parametrize('value', ['70', 'sm_90', '9.0'])
def test_other_capabilities_are_refused_by_name(value, monkeypatch):
    monkeypatch.setenv(devices.SIMULATE_VAR, value)
    with pytest.raises(ValueError, match='MMPPMA_SIMULATE_CUDA.*75, 80, 86, 89, 90, 100, 120'):
        ops.ppma_attention(*inputs(), impl='auto')


def test_the_switch_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
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
        'path_decay_tables': (lambda *t, impl: torch.stack(ops.path_decay_tables(*t, impl=impl)),
                              [torch.randn(1, 3, 4, 8), torch.randn(2, 4), torch.randn(2), torch.rand(2)]),
    }[op]


GRAD_MODES = {'grad': torch.enable_grad, 'no_grad': torch.no_grad, 'inference_mode': torch.inference_mode}


def _inject(kind, monkeypatch):
    """Make the launches fail as ``kind`` does on a GPU. Found by the preflight: a compile or resource error (raised
    when a launch compiles, which the preflight does first), a binary the driver cannot load, grids over CUDA's
    limits. Raised while a kernel runs: out of memory, a CUDA error, an exception in the host code."""
    from triton.runtime.errors import PTXASError
    errors = {'compile': lambda: PTXASError('ptxas fatal: unresolved extern function'),
              'load': lambda: lp.KernelLoadError('the provided PTX was compiled with an unsupported toolchain'),
              'oom': lambda: torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB'),
              'cuda': lambda: torch.AcceleratorError('CUDA error: an illegal memory access was encountered'),
              'host': lambda: IndexError('tuple index out of range')}

    def fail(*args):
        raise errors[kind]()

    if kind == 'grid':
        monkeypatch.setattr(lp, 'GRID_LIMITS', (0, 0, 0))
        return
    if kind in PREFLIGHT_FAILURES:
        monkeypatch.setattr(lp.Launch, 'prepare', fail)
    monkeypatch.setattr(lp.Launch, '__call__', fail)


#: what the preflight finds, and what its warning names
PREFLIGHT_FAILURES = {'compile': 'PTXASError', 'load': 'KernelLoadError', 'grid': 'LaunchLimitError'}
#: what a running kernel raises, and the type the op raises it as
RUN_FAILURES = {'oom': torch.OutOfMemoryError, 'cuda': torch.AcceleratorError, 'host': None}


def assert_one_fallback_warning(record, op, args, kind):
    """Exactly one of the recorded warnings is the fallback's, naming the op, shape, dtype, GPU and failure."""
    messages = [str(w.message) for w in record if 'falls back' in str(w.message)]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f'{op}: ') and 'simulated sm_90' in messages[0], messages[0]
    assert str(tuple(args[0].shape)) in messages[0] and 'torch.float32' in messages[0], messages[0]
    assert PREFLIGHT_FAILURES[kind] in messages[0], messages[0]


def assert_raises_as(kind, op, args, call):
    """``call()`` raises what ``kind`` raises on a GPU: out of memory and CUDA errors as they are, anything else as
    KernelLaunchError naming the op, the shape, the dtype, the GPU and the cause."""
    from mmppma.ops.triton_support.calls import KernelLaunchError
    want = RUN_FAILURES[kind] or KernelLaunchError
    with pytest.raises(want) as raised:
        call()
    if RUN_FAILURES[kind] is None:
        message = str(raised.value)
        assert message.startswith(f'{op}: ') and 'simulated sm_90' in message, message
        assert str(tuple(args[0].shape)) in message and 'IndexError' in message and "impl='torch'" in message
    else:
        assert type(raised.value) is want, type(raised.value)


@pytest.mark.parametrize('kind', PREFLIGHT_FAILURES)
@pytest.mark.parametrize('op', list(plan.IMPLEMENTATIONS))
def test_auto_falls_back_to_torch_only_for_what_the_preflight_finds(op, kind, monkeypatch):
    """On the simulated sm_90 every launch is found unable to run before any kernel runs; in each grad mode
    impl='auto' returns the torch path's result with one warning naming the op, shape, dtype, GPU and cause (once
    per input signature); impl='triton' raises naming them and impl='torch'."""
    from mmppma.ops.triton_support.calls import KernelLaunchError
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    _inject(kind, monkeypatch)
    call, args = _case(op)
    want = call(*args, impl='torch')
    for mode in GRAD_MODES.values():
        forget_preflight()
        with mode(), pytest.warns(UserWarning) as record:
            got = [call(*args, impl='auto') for _ in range(2)]
        assert_one_fallback_warning(record, op, args, kind)
        for out in got:
            torch.testing.assert_close(out, want, rtol=0, atol=0)
    with pytest.raises(KernelLaunchError,
                       match=rf"{op}: .*simulated sm_90.*{PREFLIGHT_FAILURES[kind]}.*impl='torch'"):
        call(*args, impl='triton')


@pytest.mark.parametrize('kind', RUN_FAILURES)
@pytest.mark.parametrize('op', list(plan.IMPLEMENTATIONS))
def test_a_failure_while_the_kernels_run_raises_and_is_not_remembered(op, kind, monkeypatch):
    """The preflight passes, then the first launch fails: under impl='auto' and impl='triton', in each grad mode,
    the call raises (out of memory and CUDA errors keep their type), no warning and no torch result; the next call
    launches the kernels again."""
    import warnings

    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    forget_preflight()
    call, args = _case(op)
    _inject(kind, monkeypatch)
    tries = []
    fail = lp.Launch.__call__
    monkeypatch.setattr(lp.Launch, '__call__', lambda self: tries.append(self.name) or fail(self))
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        for impl in ('auto', 'triton'):
            for mode in GRAD_MODES.values():
                with mode():
                    for _ in range(2):
                        before = len(tries)
                        assert_raises_as(kind, op, args, lambda: call(*args, impl=impl))
                        assert len(tries) == before + 1
    assert set(registered()['preflight'].values()) == {None}


@pytest.mark.parametrize('kind', RUN_FAILURES)
@pytest.mark.parametrize('op', list(plan.IMPLEMENTATIONS))
def test_a_failing_backward_launch_raises_and_is_not_remembered(op, kind, monkeypatch):
    """The preflight and the forward pass run the kernels; then every backward launch fails: the backward raises
    (out of memory and CUDA errors keep their type) under impl='auto' and impl='triton', with no warning; the next
    call launches the kernels again."""
    import warnings

    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    forget_preflight()
    call, args = _case(op)
    args = [t.requires_grad_() for t in args]
    tries = []
    monkeypatch.setattr(lp.Launch, '__call__', lambda self: tries.append(self.name))  # no interpreter run
    outs = {impl: call(*args, impl=impl) for impl in ('auto', 'triton')}
    assert tries
    grad = torch.ones_like(outs['auto'])
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        with monkeypatch.context() as m:
            _inject(kind, m)
            for out in outs.values():
                assert_raises_as(kind, op, args, lambda: torch.autograd.grad(out, args, grad))
        tries.clear()
        torch.autograd.grad(call(*args, impl='auto'), args, grad)
        assert tries
    assert set(registered()['preflight'].values()) == {None}


def test_a_gpu_outside_the_tables_takes_the_torch_path_with_one_message(monkeypatch):
    """A simulated sm_75: impl='auto' takes the torch path with one warning naming it and the tabled capabilities,
    no kernel launched; impl='triton' raises naming impl='auto'."""
    import warnings
    forget_preflight()  # the warnings given too
    ran = launched(monkeypatch)
    monkeypatch.setenv(devices.SIMULATE_VAR, '75')
    with pytest.warns(UserWarning) as record:
        for op in ('ppma_attention', 'criss_cross_attention'):
            call, args = _case(op)
            torch.testing.assert_close(call(*args, impl='auto'), call(*args, impl='torch'), rtol=0, atol=0)
    messages = [str(w.message) for w in record if 'launch table' in str(w.message)]
    assert len(messages) == 1 and 'sm_75' in messages[0], messages
    assert 'sm_80, sm_86, sm_89, sm_90, sm_100, sm_120 only' in messages[0], messages
    assert "impl='auto' takes the torch path" in messages[0], messages
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        call(*args, impl='auto')  # the one message per capability
    with pytest.raises(RuntimeError, match=r"sm_75.*impl='auto' or impl='torch'"):
        call(*args, impl='triton')
    assert not ran


@pytest.mark.parametrize('mode', GRAD_MODES)
def test_the_preflight_runs_in_any_grad_mode_and_outside_inference_mode(mode, monkeypatch):
    """Under no_grad and inference_mode the kernels run (no fallback, no warning) and equal the reference; the
    preflight records its launches with autograd on, outside the caller's inference mode."""
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    forget_preflight()
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
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    ran = launched(monkeypatch)
    args = [t.detach() for t in inputs()]
    assert resolve_impl('auto', 'ppma_attention', args, 'paper') == 'torch'
    assert resolve_impl('auto', 'ppma_attention', args, 'release') == 'triton'
    got = ops.ppma_attention(*args, form='paper', impl='auto')
    assert not ran
    torch.testing.assert_close(got, ops.ppma_attention(*args, form='paper', impl='torch'), rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="form='paper'.*impl='torch'"):
        ops.ppma_attention(*args, form='paper', impl='triton')


def test_the_simulated_gpu_has_its_cards_memory_or_the_one_set(monkeypatch):
    """A T4's 16 GiB for sm_75 and a B200's 180 GiB for sm_100 by default, ``MMPPMA_SIMULATE_CUDA_MEMORY`` GiB when
    set; none without the simulation; a value that is no positive size is refused by name."""
    cpu = torch.device('cpu')
    monkeypatch.delenv(devices.SIMULATE_MEMORY_VAR, raising=False)
    monkeypatch.setenv(devices.SIMULATE_VAR, '75')
    assert devices.device_memory(cpu) == 16 * 2**30
    monkeypatch.setenv(devices.SIMULATE_VAR, '100')
    assert devices.device_memory(cpu) == 180 * 2**30
    monkeypatch.setenv(devices.SIMULATE_MEMORY_VAR, '0.5')
    assert devices.device_memory(cpu) == 2**29 and devices.device_memory(torch.device('meta')) == 0
    for value in ('abc', '0', '-2', 'nan', 'inf'):
        monkeypatch.setenv(devices.SIMULATE_MEMORY_VAR, value)
        with pytest.raises(ValueError, match='MMPPMA_SIMULATE_CUDA_MEMORY.*in GiB'):
            devices.device_memory(cpu)
    monkeypatch.delenv(devices.SIMULATE_VAR)
    assert devices.device_memory(cpu) == 0


def test_the_torch_paths_blocks_follow_the_simulated_memory(monkeypatch):
    """PPMA-T at batch 64, 224 x 224: stage 3's whole attention (8 heads, 14 x 14: 64 * 8 * 196^2 = 19.7M score
    elements) and stage 1's criss-cross slices (4 heads, 56 x 56: 56^3 = 175616 elements per map). A score block
    may take 1/64 of a GPU's memory in float32: 2^26 elements on a 16 GiB card, where both run in one piece; 2^22
    on a 1 GiB card, where whole attention runs blocks of 2^22 // (64 * 8 * 14 * 196) = 2 query rows and the slices
    groups of 2^22 // 175616 = 23 maps (5 images of 4 heads: 13 groups); a CPU keeps its sizes."""
    from mmppma.ops.criss_cross import torch_impl as criss_cross_torch
    from mmppma.ops.whole import torch_impl as whole_torch
    cpu = torch.device('cpu')

    def sizes():
        return ([ops.whole_attention_branch(64, 8, 14, 14, grad=grad, device=cpu) for grad in (False, True)],
                whole_torch._rows_per_block(64, 8, 14, 14, cpu),
                len(list(criss_cross_torch._slices(64, 4, 56**3, cpu))))

    monkeypatch.setenv(devices.SIMULATE_VAR, '75')
    monkeypatch.delenv(devices.SIMULATE_MEMORY_VAR, raising=False)
    assert sizes() == (['autograd', 'autograd'], 14, 1)
    monkeypatch.setenv(devices.SIMULATE_MEMORY_VAR, '1')
    assert sizes() == (['inference', 'blockwise'], 2, 13)
    monkeypatch.delenv(devices.SIMULATE_VAR)  # the CPU: 2^21-element blocks (1 row), 2^18-element slices (1 map)
    assert sizes() == (['inference', 'blockwise'], 1, 256)


@pytest.mark.parametrize('memory', ['16', '1e-6'])
def test_the_torch_path_on_the_simulated_gpu_equals_the_reference(memory, monkeypatch):
    """impl='torch' on the simulated GPU, in one piece (16 GiB) and in blocks of one query row and one map
    (1e-6 GiB: 4 score elements), with and without autograd, equals the dense reference."""
    monkeypatch.setenv(devices.SIMULATE_VAR, '75')
    monkeypatch.setenv(devices.SIMULATE_MEMORY_VAR, memory)
    q, k, v, la, lb = oracle.inputs(2, 2, 3, 5, 4)
    decay = -torch.rand(2, dtype=torch.float64)
    for name, op in (('whole', lambda *t, impl: ops.ppma_attention(*t, la, lb, impl=impl)),
                     ('criss-cross', lambda *t, impl: ops.criss_cross_attention(*t, la, lb, impl=impl)),
                     ('Manhattan', lambda *t, impl: ops.manhattan_attention(*t, decay, impl=impl))):
        want = oracle.out_and_grads(lambda *t: op(*t, impl='reference'), oracle.leaf(q, k, v))
        with torch.no_grad():
            torch.testing.assert_close(op(q, k, v, impl='torch'), want[0], rtol=1e-10, atol=1e-12, msg=name)
        got = oracle.out_and_grads(lambda *t: op(*t, impl='torch'), oracle.leaf(q, k, v))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)
