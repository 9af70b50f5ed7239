"""tools/host_cost.py: what it counts, checked on steps whose launches are known, and its quick form's bounds
(PPMA-T's launches and Python calls per step; host times are a benchmark's, not enforced here)."""
import pytest
import torch

from mmppma.ops import devices

from .conftest import load_tool

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')


@pytest.fixture
def host_cost(monkeypatch):
    monkeypatch.setenv(devices.SIMULATE_VAR, '90')
    return load_tool('host_cost.py')


def test_counts_kernels_launches_and_syncs_of_a_known_step(host_cost):
    """Views and allocations launch nothing; an out-of-place op, an in-place op and a copy launch one each; a
    whole-attention call on the simulated GPU is one Triton launch; ``.item()`` and ``.tolist()`` are syncs."""
    from mmppma import ops
    x = torch.randn(2, 3, 4)
    q = torch.randn(1, 2, 4, 4, 8)
    la = -torch.rand(1, 2, 4, 4)

    def step():
        y = x.view(6, 4).t()  # views: nothing
        z = torch.empty(3)  # an allocation: nothing
        y = y + 1  # 1
        y.mul_(2)  # 1
        y.contiguous()  # a copy: 1
        z.zero_()  # 1
        y.sum().item()  # sum 1, a sync
        x[0, 0].tolist()  # a sync
        with torch.inference_mode():
            ops.ppma_attention(q, q, q, la, la, impl='auto')  # 2 cumsums, a mean, one launch

    step()
    counts = host_cost._count_step(step)
    assert sum(counts.torch.values()) == 5 + 3 and sum(counts.triton.values()) == 1, counts.ops
    assert counts.syncs == 2


def test_quick_form_holds_the_bounds(host_cost, capsys):
    """PPMA-T's float32 steps at most 345 launches (inference), 1505 (training) and 3300 Python calls (inference);
    the op host times are printed beside SDPA's."""
    assert host_cost.main(['--quick', '--check', '--repeats', '5']) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert '| launches, train-fp32 (torch + triton) |' in out and '| whole (ppma_attention) |' in out


def test_check_names_each_bound_that_fails(host_cost):
    """Counts over :data:`BOUNDS` fail ``--check``; host times over :data:`TIME_BOUNDS` fail only ``--check-times``."""
    step = dict(launches=400, python_calls=3400)
    results = {'PPMA-T': {'infer-fp32': step, 'train-fp32': dict(step, launches=1500)}}
    times = {'SDPA': dict(forward=1.0, forward_backward=1.0),
             'whole (ppma_attention)': dict(forward=7.0, forward_backward=4.0)}
    assert host_cost.check(results, times, host_cost.BOUNDS) == [
        'PPMA-T infer-fp32: 400 launches > 345', 'PPMA-T infer-fp32: 3400 Python calls > 3300']
    assert host_cost.check(results, times, host_cost.TIME_BOUNDS) == [
        'whole attention forward: host time 7.0x SDPA > 6.0x']


#: torch kernels of the release's PPMA-T inference step (``--release-dir``), at batch 2 and at batch 64 alike
RELEASE_PPMA_T_INFERENCE = 1228


def test_torch_path_at_batch_64_launches_no_more_kernels_than_the_release(host_cost, monkeypatch):
    """PPMA-T inference at batch 64, 224 x 224, ``impl='torch'`` on the simulated T4 (sm_75, 16 GiB, the smallest
    card of :data:`~mmppma.ops.devices.SIMULATED_MEMORY_GIB`): at most the release's torch kernels, as many as at
    batch 2 (whole and criss-cross attention run in one piece on a GPU, not in blocks sized for a CPU). Counted on
    fake tensors: shapes only, nothing computed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mmppma.models import PPMA
    monkeypatch.setenv(devices.SIMULATE_VAR, '75')
    model = PPMA('tiny', impl='torch')
    counts = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        for batch in (2, 64):
            step = host_cost.make_step(model, model, 'infer-fp32', torch.randn(batch, 3, 224, 224))
            if batch == 2:
                step()  # lazy tables, shared by both batches
            counted = host_cost._count_step(step)
            counts[batch] = sum(counted.torch.values()) + sum(counted.triton.values())
    assert counts[64] == counts[2] <= RELEASE_PPMA_T_INFERENCE, counts
