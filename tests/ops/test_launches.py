"""The launches themselves: CUDA's grid limits at any batch size, the inputs' device, and every configuration of the
launch tables executed against the float64 reference on the simulated device of each capability."""
import contextlib
import os
import sys

import pytest
import torch

from mmppma.ops import dispatch

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')

from mmppma.ops.triton_support import launch as lp  # noqa: E402

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'tools')


@pytest.fixture(scope='module')
def check_kernels():
    sys.path.insert(0, TOOLS)
    try:
        import check_kernels
        yield check_kernels
    finally:
        sys.path.remove(TOOLS)


@pytest.mark.parametrize('cap', dispatch.CAPABILITIES)
def test_grids_stay_within_cuda_limits_at_batch_1024(cap, check_kernels):
    """Every backbone's attention stages at the detection input (800 x 1344; PPMA-T's first stage is criss-cross
    attention on 200 x 336) with 1024 images: each launch's grid within CUDA's limits, although the lines of the
    line and scan kernels and the slices of whole attention number far more than 65535."""
    largest = {}
    for _, kind, shape in check_kernels.model_shapes(['det_800x1344'], list(check_kernels.MODELS)):
        for dtype in (torch.float32, torch.float16):
            for _, launch in check_kernels.record(kind, (1024, *shape[1:]), dtype, cap):
                assert all(n <= limit for n, limit in zip(launch.grid, lp.GRID_LIMITS)), (launch.name, launch.grid)
                programs = 1
                for n in launch.grid:
                    programs *= n
                largest[launch.name] = max(largest.get(launch.name, 0), programs)
    assert set(largest) == {'_whole_fwd', '_whole_bwd', '_line_fwd', '_line_bwd', '_scan_kernel'}
    assert all(n > 65535 for n in largest.values()), largest


def test_a_grid_over_the_limits_is_refused():
    with pytest.raises(lp.LaunchLimitError, match=r'grid \(1, 65536\) exceeds'):
        lp.Launch(lambda: None, (1, 65536), (), {}, lp.config('scan', 1, torch.float32, 80))


def test_launches_run_on_the_inputs_device(monkeypatch):
    """Tensors on cuda:1 (fake tensors: no GPU needed) launch inside ``torch.cuda.device(cuda:1)``, whatever the
    current device is."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mmppma.ops.scan.triton_impl import scan_launches
    from mmppma.ops.whole.triton_impl import forward_launches
    entered, during = [], []

    @contextlib.contextmanager
    def device(d):
        entered.append(torch.device(d))
        yield

    monkeypatch.setattr(torch.cuda, 'device', device)
    monkeypatch.setattr(lp.Launch, '__call__', lambda self: during.append((self.name, entered and entered[-1])))
    with FakeTensorMode():
        x = torch.empty(6, 40, 8, device='cuda:1')
        launches, _ = scan_launches(x, torch.empty(6, 40, device='cuda:1'), False, 80)
        q = torch.empty(2, 35, 16, device='cuda:1')
        tables = torch.empty(2, 5, 7, device='cuda:1')
        launches += forward_launches(q, q, q, tables, tables, 0.25, 'release', 80)[0]
        lp.run(launches)
    assert during == [(x.name, torch.device('cuda:1')) for x in launches] and len(during) == 3
