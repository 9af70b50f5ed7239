"""tools/visualize_polyline_mask.py: the CLI writes its figures; the maps equal the dense-mask definitions."""
import numpy as np
import pytest
import torch

from mmppma.ops import polyline_mask

from ..conftest import load_tool
from .conftest import TINY_SEG, TOOLS, run_tool


@pytest.fixture(scope='module')
def image(tiny_data):
    return tiny_data / 'coco' / 'val' / 'val_000001.jpg'


def test_cli_writes_figures_and_maps(tiny_env, image, tmp_path):
    pytest.importorskip('mmseg.models')
    args = [TOOLS / 'visualize_polyline_mask.py', TINY_SEG, 'none', image, '--out', tmp_path, '--stage', '1']
    proc = run_tool([*args, '--block', '1', '--query', '2', '3', '--size', '96'], tiny_env)
    written = proc.stdout.split()[-3:]  # the paths are the last lines (after mmengine's log)
    assert [p.split('/')[-1] for p in written] == ['decay_s1b1.png', 'attention_s1b1_q2_3.png', 'maps_s1b1_q2_3.npz']
    assert all(open(path, 'rb').read(8) == b'\x89PNG\r\n\x1a\n' for path in written[:2])
    maps = np.load(written[2])
    assert maps['alpha'].shape == maps['attention_masked'].shape
    assert maps['alpha'].shape[:2] == (4, 12)  # PPMA-T stage 1's heads; short side 96 px / stride 8
    assert ((maps['alpha'] > 0) & (maps['alpha'] <= 1)).all() and ((maps['beta'] > 0) & (maps['beta'] <= 1)).all()
    proc = run_tool([*args, '--query', '12', '0', '--size', '96'], tiny_env, check=False)
    assert proc.returncode != 0 and 'token grid at --size 96' in proc.stderr


@pytest.mark.parametrize('stage', [0, 2], ids=['criss_cross', 'whole'])
def test_maps_match_the_dense_definitions(tiny_env, image, stage):
    pytest.importorskip('mmseg.models')
    tool = load_tool('visualize_polyline_mask.py')
    backbone, (mean, std) = tool.build_backbone(str(TINY_SEG), 'none')
    _, x = tool.load_image(str(image), 64, mean, std)
    attn, captured = tool.capture_attention_inputs(backbone, x, stage, 0)
    q, k, tokens = captured['q'], captured['k'], captured['x']
    h, w = q.shape[2:4]
    i, j = h // 2, w // 3
    maps = tool.attention_maps(attn, captured, i, j)
    with torch.no_grad():
        la, lb = attn.path_embed(tokens)
    p = i * w + j
    dense = polyline_mask(la.double(), lb.double(), form='2d', space='linear')[0, :, p]  # (heads, N)
    np.testing.assert_allclose(maps['mask'].reshape(dense.shape), dense.numpy(), rtol=1e-5, atol=1e-6)
    weights = maps['attention_masked'].reshape(dense.shape[0], -1)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-4)  # convex combinations of the values
    if stage == 2:  # whole attention, release form: 0.5 softmax(S + M) + 0.5 softmax(S + M^T), query row
        s = torch.einsum('hd,hnd->hn', q[0, :, i, j].double(), k[0].double().flatten(1, 2))
        m = polyline_mask(la.double(), lb.double(), form='v2h')[0]
        expected = 0.5 * (s + m[:, p]).softmax(-1) + 0.5 * (s + m[:, :, p]).softmax(-1)
        np.testing.assert_allclose(weights, expected.numpy(), rtol=1e-4, atol=1e-6)
    else:  # criss-cross: a query only reaches its row and column in one step, but every token in two
        assert (weights > 0).mean() > 0.9
