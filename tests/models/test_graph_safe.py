"""The kernel path is graph-safe: with ``impl='auto'`` on the simulated GPU (``MMPPMA_SIMULATE_CUDA``) PPMA-T, RMT-T
and PPMLA-T trace into one graph under ``torch.compile(fullgraph=True)``, in eval and in a training step; an eager
step makes no host sync, builds no tensor from host data and hands the kernels only tensors that torch allocated;
the device query traces. The kernels' launches are recorded, not interpreted: the host side is what is tested."""
import contextlib
import os
import sys
import traceback
import types

import pytest
import torch
import torch._dynamo
from torch._library.custom_ops import OPDEFS
from torch.utils._python_dispatch import TorchDispatchMode

from mmppma.models import MLLA, PPMA, RMT
from mmppma.ops import devices

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')
if torch.cuda.is_available():
    pytest.skip('the simulated GPU runs CPU tensors (a GPU is here)', allow_module_level=True)

from mmppma.ops.triton_support import launch  # noqa: E402

from ..conftest import forget_preflight  # noqa: E402
from .conftest import DECAY_KERNELS as DECAYS  # noqa: E402
from .conftest import LINE_KERNELS as LINE  # noqa: E402
from .conftest import LINEAR_KERNELS as LINEAR  # noqa: E402
from .conftest import NO_FALLBACK  # noqa: E402
from .conftest import WHOLE_KERNELS as WHOLE  # noqa: E402

pytestmark = NO_FALLBACK
#: the tiny models and the kernels a training step launches; the library ops their graphs hold
MODELS = {
    'PPMA-T': (lambda: PPMA('tiny', impl='auto'), LINE | WHOLE | DECAYS,
               {'mmppma.line_attention_triton', 'mmppma.whole_attention_triton'}),
    'RMT-T': (lambda: RMT('tiny', impl='auto'), LINE | WHOLE,
              {'mmppma.line_attention_triton', 'mmppma.whole_attention_triton'}),
    'PPMLA-T': (lambda: MLLA('tiny', mask='polyline', impl='auto'), LINEAR,
                {'mmppma.linear_attention_triton'}),
}
#: batch 2 (a BatchNorm in training needs two values per channel at the last stage's 1 x 1 map)
SHAPE = (2, 3, 32, 32)
#: ops that copy a device value to the host (an item, a data-dependent output size)
SYNC_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
            torch.ops.aten.masked_select.default, torch.ops.aten.item.default}
#: the op a tensor made from host data (``torch.tensor(list)``, ``torch.as_tensor``) passes through
HOST_DATA_OPS = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}
#: tensor methods and torch functions that move data between host and device
HOST_CALLS = [(torch.Tensor, name) for name in ('item', 'tolist', 'cpu', 'numpy')] + [
    (torch, name) for name in ('tensor', 'as_tensor', 'from_numpy')]
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(devices.__file__)))


@pytest.fixture
def kernels(monkeypatch):
    """The simulated sm_90; every kernel launch (:class:`~mmppma.ops.triton_support.launch.Launch`) on CPU tensors
    from now on, recorded instead of run (the preflight's recording on meta tensors goes on as it is); earlier
    preflight verdicts forgotten."""
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    forget_preflight()
    seen, run = [], launch.run

    def record(launches):
        if launch._RECORDING:
            return run(launches)
        seen.extend(launches)

    monkeypatch.setattr(launch, 'run', record)
    return seen


def _step(model, x, train):
    """A training step's outputs (forward, backward of a fixed functional) or eval's under inference_mode."""
    model.train(train)
    with contextlib.nullcontext() if train else torch.inference_mode():
        outs = model(x)
    if train:
        sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs).backward()
    return outs


def _recording_backend(graphs, name):
    """The backend ``name``, keeping each graph dynamo hands it."""
    compiler = torch._dynamo.lookup_backend(name)

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compiler(gm, example_inputs)

    return backend


@pytest.mark.parametrize('train', [pytest.param(True, marks=pytest.mark.slow, id='train'),
                                   pytest.param(False, id='eval')])
@pytest.mark.parametrize('name', list(MODELS))
def test_tiny_model_compiles_into_one_graph_on_the_kernel_path(name, train, kernels):
    """fullgraph=True, a training step on aot_eager (dynamo, then AOTAutograd's forward and backward graphs), eval
    under inference_mode on eager (dynamo): no graph break; the graph holds the Triton ops and the plain aten conv
    (a GPU graph keeps inductor's own conv handling); the compiled step launches the kernels, in training the
    backward's too."""
    build, launched, library_ops = MODELS[name]
    model = build()
    graphs = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=_recording_backend(graphs, 'aot_eager' if train else 'eager'),
                             fullgraph=True)
    _step(compiled, torch.randn(SHAPE), train)
    assert len(graphs) == 1
    code = graphs[0].code
    assert all(op in code for op in library_ops), code
    assert 'torch.conv2d' in code and 'mmppma.conv2d' not in code and 'mmppma.tokens_to_nchw' not in code
    # while torch.compile traces, the decay tables take the torch path (inductor fuses it)
    want = {k for k in launched - DECAYS if train or 'bwd' not in k}
    assert {x.name for x in kernels} == want
    if train:
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


class HostTraffic(TorchDispatchMode):
    """Records every sync op and host-data op dispatched (also inside the bodies of ``torch.library.custom_op`` ops,
    which it runs under a mode of its own), and the storage of every tensor an op returns."""

    def __init__(self, record):
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNC_OPS:
            self.record.syncs.append(str(func))
        if func in HOST_DATA_OPS:
            frames = [f for f in traceback.extract_stack() if f.filename.startswith(PACKAGE + os.sep)]
            self.record.host_data.append(f'{func} at ' + (
                f'{os.path.relpath(frames[-1].filename, os.path.dirname(PACKAGE))}:{frames[-1].lineno}'
                if frames else 'a caller outside mmppma'))
        opdef = OPDEFS.get(func._schema.name)  # a torch.library.custom_op: its body runs under a mode of its own
        if opdef is None:
            out = func(*args, **kwargs)
        else:
            with HostTraffic(self.record):
                out = opdef._init_fn(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else (out, ):
            if isinstance(t, torch.Tensor):
                self.record.storages.add(t.untyped_storage().data_ptr())
        return out


@contextlib.contextmanager
def host_traffic(monkeypatch):
    """Within the block: the sync ops, host-data ops and allocations dispatched (:class:`HostTraffic`), and each
    call of :data:`HOST_CALLS` made from mmppma's code, by name and the line that made it."""
    record = types.SimpleNamespace(syncs=[], host_data=[], storages=set(), calls=[])
    with monkeypatch.context() as patch:
        for owner, name in HOST_CALLS:
            def counted(*args, _name=name, _original=getattr(owner, name), **kwargs):
                frame = sys._getframe(1)
                if frame.f_code.co_filename.startswith(PACKAGE + os.sep):
                    record.calls.append(f'{_name} at {frame.f_code.co_filename}:{frame.f_lineno}')
                return _original(*args, **kwargs)

            patch.setattr(owner, name, counted)
        with HostTraffic(record):
            yield record


class HostDataBuilt(AssertionError):
    """A tensor built from host data in a step (the sites listed)."""


@pytest.mark.parametrize('name', ['PPMA-T', 'RMT-T', 'PPMLA-T'])
def test_an_eager_step_makes_no_host_sync(name, kernels, monkeypatch):
    """A training step then an eval step on the kernel path: no sync op, no call that moves data between host and
    device from mmppma's code; every tensor a kernel gets was allocated by torch in the step or is the model's or
    the input's; no tensor built from host data (:class:`HostDataBuilt` lists where)."""
    build, launched, _ = MODELS[name]
    model = build()
    x = torch.randn(SHAPE)
    owned = {t.untyped_storage().data_ptr() for t in [x, *model.parameters(), *model.buffers()]}
    with host_traffic(monkeypatch) as record:
        _step(model, x, True)
        _step(model, x, False)
    assert {k.name for k in kernels} == launched  # the step ran the kernel path
    assert record.syncs == [] and record.calls == [], (record.syncs, record.calls)
    for item in kernels:
        for arg in item.args:
            if isinstance(arg, torch.Tensor):
                assert arg.untyped_storage().data_ptr() in record.storages | owned, (item.name, arg.shape)
            else:
                assert isinstance(arg, (int, float)), (item.name, type(arg))
    if record.host_data:
        raise HostDataBuilt(sorted(set(record.host_data)))


def test_the_counters_see_a_sync_inside_a_library_op(monkeypatch):
    """The check above is not blind: an ``.item()`` and a ``torch.tensor(list)`` inside a library op's body are
    seen, and a host call is named with its line when mmppma's code makes it, not otherwise."""
    @torch.library.custom_op('mmppma_test::syncing', mutates_args=())
    def syncing(x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item() + torch.tensor([1.0, 2.0])

    in_package = compile('\n\nt.tolist()', os.path.join(PACKAGE, 'stand_in.py'), 'exec')
    with host_traffic(monkeypatch) as record:
        syncing(torch.ones(2))
        exec(in_package, dict(t=torch.ones(1)))
    assert record.syncs == ['aten.item.default']
    assert record.host_data == ['aten.lift_fresh.default at a caller outside mmppma']
    assert record.calls == [f'tolist at {os.path.join(PACKAGE, "stand_in.py")}:3']


def test_the_device_query_traces_without_a_graph_break(monkeypatch):
    """On a real GPU the ops ask the capability (:func:`mmppma.ops.devices.device_capability`) while dynamo traces:
    with the device's properties stood in, that query is a constant of the graph, not a break."""
    monkeypatch.setattr(torch.cuda, 'get_device_properties',
                        lambda device=None: types.SimpleNamespace(major=9, minor=0, name='stand-in'))

    def scaled(x):
        return x * devices.device_capability(torch.device('cuda', 0))

    torch._dynamo.reset()
    out = torch.compile(scaled, backend='eager', fullgraph=True)(torch.ones(2))
    assert out.tolist() == [90.0, 90.0]
