"""What the model tests share: small archs, every backbone family as a builder, a release-style classifier around
a backbone, and skips that name why a downstream library is unusable."""
import importlib
import math
from dataclasses import dataclass, field
from typing import Optional

import pytest
import torch
import torch.nn as nn

from mmppma.models import MLLA, PPMA, RMT, VMINet

from ..ops.oracle import apply_per_head, mask_v2h

#: Small enough for fast CPU forward/backward, with both attention types and four stages.
#: the Triton kernels of each op family, by name
LINE_KERNELS = {'_line_fwd', '_line_bwd'}
WHOLE_KERNELS = {'_whole_fwd', '_whole_bwd'}
LINEAR_KERNELS = {'_ppmla_fwd', '_ppmla_bwd'}
#: the learned decays' tables (mmppma.ops.path_decay_tables)
DECAY_KERNELS = {'_tables_fwd', '_tables_bwd'}
#: a kernel that cannot run falls back to the torch path with a warning: under this mark an error naming the cause
NO_FALLBACK = pytest.mark.filterwarnings("error:.*impl='auto' falls back:UserWarning")

SMALL_ARCH = dict(embed_dims=[16, 32, 32, 64], depths=[1, 1, 2, 1], num_heads=[2, 2, 4, 4], mlp_ratios=[2, 2, 2, 2],
                  attn_types=['criss_cross', 'criss_cross', 'whole', 'whole'])
MLLA_ARCH = dict(embed_dims=[16, 32, 32, 64], depths=[1, 1, 2, 1], num_heads=[2, 2, 4, 4], mlp_ratio=2.0)
VMINET_ARCH = dict(embed_dims=[8, 16, 24, 32], depths=[1, 1, 2, 1], mlp_ratios=[2, 2, 2, 2], stem_channels=8)
#: Two stages of one block each (PPMA, RMT: a criss-cross, then a whole-attention stage), quick to compile; the
#: variants by name as builders taking impl.
TWO_STAGE_ARCH = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[2, 4], mlp_ratios=[2, 2],
                      attn_types=['criss_cross', 'whole'])
#: the same in whole attention only: what form 'paper' takes
TWO_WHOLE_STAGES_ARCH = dict(TWO_STAGE_ARCH, attn_types=['whole', 'whole'])
TWO_STAGES = {
    'PPMA': lambda impl='torch', arch=TWO_STAGE_ARCH, **kwargs: PPMA(arch, impl=impl, out_indices=(0, 1), **kwargs),
    'RMT': lambda impl='torch': RMT(TWO_STAGE_ARCH, impl=impl, out_indices=(0, 1)),
    **{name: lambda impl='torch', mask=mask: MLLA(dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[2, 4]),
                                                 mask=mask, impl=impl, out_indices=(0, 1))
       for name, mask in (('MLLA', 'none'), ('PPMLA', 'polyline'))},
    'VMINet': lambda impl='torch': VMINet(dict(embed_dims=[8, 16], depths=[1, 1], mlp_ratios=[2, 2]), img_size=32,
                                          out_indices=(0, 1)),
}


@dataclass
class Family:
    cls: type
    arch: dict
    kwargs: dict = field(default_factory=dict)
    #: a keyword with a bad value and the message that must name the choices
    bad_choice: tuple = ()
    #: a per-stage key of ``arch`` (for the wrong-length error)
    per_stage: str = 'embed_dims'

    def build(self, **kwargs) -> nn.Module:
        return self.cls(self.arch, **{**self.kwargs, **kwargs})


FAMILIES = {
    'PPMA': Family(PPMA, SMALL_ARCH, bad_choice=(dict(mask='cross_scan'), "mask='cross_scan'.*'polyline'")),
    'RMT': Family(RMT, SMALL_ARCH, bad_choice=(dict(mask='polyline'), r'RMT takes no mask.*PPMA\(mask=\.\.\.\)')),
    'MLLA': Family(MLLA, MLLA_ARCH, bad_choice=(dict(mask='softmax'), r"mask='softmax'.*'none', 'polyline'"),
                   per_stage='num_heads'),
    'PPMLA': Family(MLLA, MLLA_ARCH, dict(mask='polyline'), per_stage='num_heads',
                    bad_choice=(dict(mask='PPMLA'), r"mask='PPMLA'.*'none', 'polyline'")),
    'VMINet': Family(VMINet, VMINET_ARCH, dict(img_size=64), per_stage='mlp_ratios',
                     bad_choice=(dict(context_mask='banded'), "context_mask='banded'.*'none', 'tril'")),
}


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def out_size(n: int, stage: int) -> int:
    """Every backbone halves the map twice in its stem and once per later stage, rounding up."""
    for _ in range(stage + 2):
        n = math.ceil(n / 2)
    return n


class Classifier(nn.Module):
    """The backbone, then ``head`` on its outputs, by default the last one's global average pool and Linear(C, 1000)."""

    def __init__(self, backbone: nn.Module, head: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.backbone, self.pool = backbone, head is None
        self.head = nn.Linear(backbone.embed_dims[-1], 1000) if head is None else head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(x)
        return self.head(feats[-1].mean((2, 3))) if self.pool else self.head(feats)


def ref_v2h_mask(la, lb):
    """The V2H log-mask (B, heads, N, N) of tests/ops/oracle.py's loops."""
    return torch.from_numpy(apply_per_head(mask_v2h, la.detach().double().numpy(), lb.detach().double().numpy()))


def require(module: str) -> None:
    """Skip the test when ``module`` cannot be imported (e.g. mmpretrain without torchvision), naming the error."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        pytest.skip(f'{module} is not importable here: {type(e).__name__}: {e}')


@pytest.fixture
def mmpretrain_ready() -> None:
    require('mmpretrain.models')


@pytest.fixture
def mmdet_ready() -> None:
    require('mmdet.models')


@pytest.fixture
def mmseg_ready() -> None:
    require('mmseg.models')
