"""tools/meta_count.py at MLLA-T's stage 1 (B 64, 2 heads, 56 x 56, d 32, fp16, sm_90 table): PPMLA's forward
tensors, largest tensor, saved bytes and launches within the tool's bounds, and the counts the fused kernels'
design gives."""
import pytest
import torch

from .conftest import load_tool

pytest.importorskip('triton', reason='triton is part of the pinned stack (requirements.txt); install it')

B, HEADS, H, W, D = 64, 2, 56, 56, 32


@pytest.mark.parametrize('op', ['linear', 'decomposed'])
def test_stage_one_counts_hold_the_bounds(op):
    meta_count = load_tool('meta_count.py')
    counts = meta_count.count(op, B, HEADS, (H, W), D, torch.float16, 90)
    assert meta_count.failures(counts) == {}, counts
    # one forward launch, the backward's query and key launches; the products of half tiles on tensor cores, those
    # with a computed float32 tile in TF32
    assert (counts['forward_launches'], counts['backward_launches']) == (1, 2)
    assert counts['kernels'] == ['_ppmla_bwd', '_ppmla_fwd']
    assert (counts['precision'], counts['wide']) == (['None'], ['tf32'])
    # nothing larger than one float32 (B, heads, H, W, d) tensor: no per-token d x d_v state, no N x N tensor
    assert counts['largest_bytes'] == B * HEADS * H * W * D * 4


def test_the_check_fails_over_a_bound(monkeypatch, capsys):
    meta_count = load_tool('meta_count.py')
    monkeypatch.setitem(meta_count.BOUNDS, 'backward_launches', 1)
    assert meta_count.main(['--size', '7', '7', '--batch', '2', '--check']) == 1
    assert "FAILED {'backward_launches': 2}" in capsys.readouterr().out
