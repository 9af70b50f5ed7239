"""Helpers for the model tests: a small arch and skips that name why a downstream library is unusable."""
import importlib

import pytest

#: Small enough for fast CPU forward/backward, with both attention types and four stages.
SMALL_ARCH = dict(
    embed_dims=[16, 32, 32, 64],
    depths=[1, 1, 2, 1],
    num_heads=[2, 2, 4, 4],
    mlp_ratios=[2, 2, 2, 2],
    attn_types=['criss_cross', 'criss_cross', 'whole', 'whole'])


def require(module: str) -> None:
    """Skip the test when ``module`` cannot be imported, with the import error as the reason (e.g. mmpretrain
    installed without torchvision)."""
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
