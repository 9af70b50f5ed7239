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


@pytest.mark.parametrize('op', ['linear', 'decomposed'])
def test_the_chunked_form_at_detection_size_keeps_to_the_inputs_bytes(op):
    """MLLA-T's stage 1 at 800 x 1344 (B 2, 200 x 336): the chunked form runs; its forward produces at most 1.5x the
    bytes of q, k, v and the output together and saves at most that for the backward (the inputs themselves, no
    float32 copies), and no tensor of forward or backward reaches an eighth of one per-token d x d state per image
    and head (the largest: the backward's queries of a chunk, 16 rows x 336 x d x d)."""
    meta_count = load_tool('meta_count.py')
    b, h, w = 2, 200, 336
    counts = meta_count.count(op, b, HEADS, (h, w), D, torch.float16, 90)
    assert '_queries' in counts['kernels'] and '_ppmla_fwd' not in counts['kernels']
    io = 4 * b * HEADS * h * w * D * 2
    assert counts['forward_bytes'] <= 1.5 * io and counts['saved_bytes'] <= 1.5 * io, counts
    assert counts['largest_bytes'] < b * HEADS * h * w * D * D * 4 / 8


def test_the_check_fails_over_a_bound(monkeypatch, capsys):
    meta_count = load_tool('meta_count.py')
    monkeypatch.setitem(meta_count.BOUNDS, 'backward_launches', 1)
    assert meta_count.main(['--size', '7', '7', '--batch', '2', '--check']) == 1
    assert "FAILED {'backward_launches': 2}" in capsys.readouterr().out
