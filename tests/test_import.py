"""What ``import mmppma`` does to the process beyond registering (the package docstring names each): the training
runner set-up stays unimported, and the release load hook reaches only parents of an mmppma backbone."""
import subprocess
import sys

import torch
import torch.nn as nn

from mmppma.models import PPMA

from .conftest import REPO_ROOT


def test_import_leaves_the_runner_setup_unimported():
    code = ('import sys, mmppma, mmppma.ops; '
            "print(sorted(m for m in ('mmppma.utils.runner_setup', 'mmppma.utils.configs', 'mmppma.deploy') "
            'if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == '[]', out.stdout


def test_the_load_hook_never_touches_a_model_without_an_mmppma_backbone():
    plain = nn.Sequential(nn.Linear(3, 2), nn.ModuleDict(dict(backbone=nn.Linear(2, 2))))
    assert all(not m._load_state_dict_pre_hooks for m in plain.modules())
    state = {k: torch.randn_like(v) for k, v in plain.state_dict().items()}
    plain.load_state_dict(state)
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in state.items())


def test_the_load_hook_passes_a_non_release_state_dict_through():
    parent = nn.ModuleDict(dict(backbone=PPMA(dict(embed_dims=[16], depths=[1], num_heads=[2], mlp_ratios=[2],
                                                   attn_types=['whole']), out_indices=(0, ))))
    assert len(parent._load_state_dict_pre_hooks) == 1
    state = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in parent.state_dict().items()}
    parent.load_state_dict(state)  # mmppma's own layout: loaded as it is
    assert all(torch.equal(parent.state_dict()[k], v) for k, v in state.items())
