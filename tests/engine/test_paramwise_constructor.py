"""ParamwiseOptimWrapperConstructor: mmengine's default param groups, as plain dicts, and a train step with the
optimizer update that ``torch.compile`` traces (what ``compile=True`` compiles)."""
import copy

import torch
import torch._dynamo
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.optim import DefaultOptimWrapperConstructor

from mmppma.engine import LayerDecayOptimWrapperConstructor, ParamwiseOptimWrapperConstructor

# as a Runner passes it: a ConfigDict, with the det / seg base configs' paramwise_cfg
CFG = ConfigDict(
    type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05))
PARAMWISE = ConfigDict(norm_decay_mult=0.0, custom_keys={'.A_log': dict(decay_mult=0.0)})


class Net(nn.Module):

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)
        self.A_log = nn.Parameter(torch.zeros(6))

    def forward(self, x):
        return self.fc(self.norm(x)) * self.A_log.exp()


def test_groups_are_mmengines_as_plain_dicts():
    """mmengine's groups, as dicts (what dynamo traces); the layer decay constructor's groups too."""
    model = Net()
    ours = ParamwiseOptimWrapperConstructor(copy.deepcopy(CFG), copy.deepcopy(PARAMWISE))(model).optimizer
    theirs = DefaultOptimWrapperConstructor(copy.deepcopy(CFG), copy.deepcopy(PARAMWISE))(model).optimizer
    assert any(type(g) is not dict for g in theirs.param_groups)  # what dynamo fails on
    assert all(type(g) is dict for g in ours.param_groups)
    assert len(ours.param_groups) == len(theirs.param_groups) == 5
    for g, h in zip(ours.param_groups, theirs.param_groups):
        assert [id(p) for p in g['params']] == [id(p) for p in h['params']]
        assert {k: v for k, v in g.items() if k != 'params'} == {k: v for k, v in h.items() if k != 'params'}
    decays = {name: g['weight_decay'] for name, p in model.named_parameters() for g in ours.param_groups
              if any(p is q for q in g['params'])}
    assert decays == {'fc.weight': 0.05, 'fc.bias': 0.05, 'norm.weight': 0.0, 'norm.bias': 0.0, 'A_log': 0.0}
    wrapper = LayerDecayOptimWrapperConstructor(copy.deepcopy(CFG), ConfigDict(layer_decay_rate=1.0))(Net())
    assert wrapper.optimizer.param_groups and all(type(g) is dict for g in wrapper.optimizer.param_groups)


def test_compiled_train_step_with_the_optimizer_update_equals_eager():
    """What mmengine's ``compile=True`` compiles: forward, backward and the optimizer step in one function."""
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    models = [Net(), Net()]
    models[1].load_state_dict(models[0].state_dict())
    wrappers = [ParamwiseOptimWrapperConstructor(copy.deepcopy(CFG), copy.deepcopy(PARAMWISE))(m) for m in models]

    def train_step(model, wrapper):
        loss = model(x).square().mean()
        wrapper.update_params(loss)
        return loss.detach()

    torch._dynamo.reset()
    compiled = torch.compile(train_step, backend='aot_eager')  # dynamo traces the optimizer step
    for _ in range(2):
        eager_loss = train_step(models[0], wrappers[0])
        compiled_loss = compiled(models[1], wrappers[1])
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
