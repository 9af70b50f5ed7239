"""mmppma.CPUAmpOptimWrapper: bfloat16 autocast around the forward, a float32 step, float16 refused."""
import pytest
import torch
from mmengine.registry import OPTIM_WRAPPERS

import mmppma  # noqa: F401  (registers the wrapper)


def test_forward_in_bfloat16_step_in_float32():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    steps = {}
    for name, net, wrapper in (('amp', model, 'mmppma.CPUAmpOptimWrapper'), ('fp32', reference, 'OptimWrapper')):
        optim = OPTIM_WRAPPERS.build(dict(type=wrapper, optimizer=torch.optim.SGD(net.parameters(), lr=0.1)))
        with optim.optim_context(net):
            out = net(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        optim.update_params(loss)
        steps[name] = (out.dtype, loss.detach(), [p.detach().clone() for p in net.parameters()])
    assert steps['amp'][0] == torch.bfloat16 and steps['fp32'][0] == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    torch.testing.assert_close(steps['amp'][1], steps['fp32'][1], rtol=3e-2, atol=0)
    for got, want in zip(steps['amp'][2], steps['fp32'][2]):
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-3)
    assert not torch.is_autocast_enabled('cpu')  # only inside optim_context


def test_float16_is_refused_by_name():
    with pytest.raises(ValueError, match="dtype='float16'.*dtype='bfloat16'.*AmpOptimWrapper"):
        OPTIM_WRAPPERS.build(dict(type='mmppma.CPUAmpOptimWrapper', dtype='float16',
                                  optimizer=torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)))
