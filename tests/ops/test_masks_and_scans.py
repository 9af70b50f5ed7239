"""Dense polyline masks and the mask-vector product (Algorithm 1) against the loop oracle, float64."""
import numpy as np
import pytest
import torch

from mmppma.ops import (
    decay_scan_1d,
    decay_tables,
    manhattan_decay_mask,
    polyline_mask,
    polyline_mask_3d,
    polyline_mask_matvec,
    polyline_mask_matvec_3d,
    segment_sum,
)

from . import oracle

SHAPES = [(1, 1), (1, 9), (9, 1), (7, 7), (13, 17), (14, 14)]


def decays(b, heads, h, w, seed=0, scale=1.0, offset=0.0, dtype=torch.float64):
    """Log-decays in [-(offset + scale), -offset]."""
    g = torch.Generator().manual_seed(seed)
    la = -(torch.rand(b, heads, h, w, generator=g, dtype=dtype) * scale + offset)
    lb = -(torch.rand(b, heads, h, w, generator=g, dtype=dtype) * scale + offset)
    return la, lb


@pytest.mark.parametrize('hw', SHAPES)
def test_mask_and_matvec_match_loop_oracle(hw):
    h, w = hw
    la, lb = decays(2, 2, h, w, seed=h * 100 + w)
    want = oracle.apply_per_head(oracle.mask_v2h, la.numpy(), lb.numpy())
    want_t = np.swapaxes(want, -1, -2)
    l2d = np.exp(want) + np.exp(want_t)
    np.testing.assert_allclose(polyline_mask(la, lb, form='v2h').numpy(), want, atol=1e-12)
    np.testing.assert_allclose(polyline_mask(la, lb, form='h2v').numpy(), want_t, atol=1e-12)
    np.testing.assert_allclose(polyline_mask(la, lb, form='v2h', space='linear').numpy(), np.exp(want), atol=1e-12)
    np.testing.assert_allclose(polyline_mask(la, lb, form='2d', space='linear').numpy(), l2d, rtol=1e-12)
    np.testing.assert_allclose(polyline_mask(la, lb, form='2d').numpy(), np.log(l2d), atol=1e-12)
    # one slice of depth one (no decay along D): the 3D mask is the 2D one
    torch.testing.assert_close(polyline_mask_3d(la[:, :, None], lb[:, :, None], torch.zeros_like(la)[:, :, None]),
                               polyline_mask(la, lb, form='v2h'))
    x = torch.randn(2, 2, h, w, 5, dtype=torch.float64)
    xf = x.numpy().reshape(2, 2, h * w, 5)
    for chunk in (3, 64):
        for form, lmask, atol in (('v2h', np.exp(want), 1e-12), ('h2v', np.exp(want_t), 1e-12), ('2d', l2d, 0)):
            got = polyline_mask_matvec(x, la, lb, form=form, chunk=chunk).numpy().reshape(2, 2, h * w, 5)
            np.testing.assert_allclose(got, lmask @ xf, rtol=1e-10, atol=atol, err_msg=f'{form} chunk {chunk}')


def test_mask_is_product_of_decays_on_a_hand_example():
    # 2 x 2 map, alpha = exp(la), beta = exp(lb): from (0, 0) to (1, 1) the V2H path goes right along
    # row 0 (alpha[0, 1]) then down column 1 (beta[1, 1]); H2V goes down column 0 (beta[1, 0]) then right
    # along row 1 (alpha[1, 1]).
    la = torch.log(torch.tensor([[0.9, 0.8], [0.7, 0.6]], dtype=torch.float64))[None, None]
    lb = torch.log(torch.tensor([[0.5, 0.4], [0.3, 0.2]], dtype=torch.float64))[None, None]
    lmask = polyline_mask(la, lb, form='v2h', space='linear')[0, 0]
    assert lmask[0, 3].item() == pytest.approx(0.8 * 0.2)
    assert lmask[3, 0].item() == pytest.approx(0.6 * 0.3)  # from (1,1): left along row 1, up column 0
    assert polyline_mask(la, lb, form='h2v', space='linear')[0, 0, 0, 3].item() == pytest.approx(0.3 * 0.6)
    assert torch.allclose(lmask.diagonal(), torch.ones(4, dtype=torch.float64))


def test_decay_tables_are_float32_for_half_inputs():
    la, lb = decays(1, 2, 3, 5, dtype=torch.float16)
    ca, cb = decay_tables(la, lb)
    assert ca.dtype == torch.float32 and cb.dtype == torch.float32
    torch.testing.assert_close(ca, la.float().cumsum(-1))
    torch.testing.assert_close(cb, lb.float().cumsum(-2))


@pytest.mark.parametrize('length', [1, 5, 63, 64, 65, 200])
@pytest.mark.parametrize('chunk', [4, 7, 64])
def test_decay_scan_1d_matches_dense(length, chunk):
    g = torch.Generator().manual_seed(length)
    x = torch.randn(3, length, 4, generator=g, dtype=torch.float64)
    a = -torch.rand(3, length, generator=g, dtype=torch.float64)
    dense = np.exp([[[oracle.seg(line, t, s) for s in range(length)] for t in range(length)] for line in a.numpy()])
    want = dense @ x.numpy()
    np.testing.assert_allclose(decay_scan_1d(x, a, chunk=chunk).numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('dhw', [(1, 1, 1), (2, 3, 4), (3, 1, 5), (4, 3, 2)])
def test_3d_mask_and_matvec(dhw):
    d, h, w = dhw
    g = torch.Generator().manual_seed(sum(dhw))
    la, lb, lc = (-torch.rand(1, 2, d, h, w, generator=g, dtype=torch.float64) for _ in range(3))
    want = oracle.apply_per_head(oracle.mask_3d, la.numpy(), lb.numpy(), lc.numpy())
    np.testing.assert_allclose(polyline_mask_3d(la, lb, lc).numpy(), want, atol=1e-12)
    x = torch.randn(1, 2, d, h, w, 3, generator=g, dtype=torch.float64)
    got = polyline_mask_matvec_3d(x, la, lb, lc, chunk=2).numpy().reshape(1, 2, d * h * w, 3)
    np.testing.assert_allclose(got, np.exp(want) @ x.numpy().reshape(1, 2, -1, 3), rtol=1e-10, atol=1e-12)


def test_manhattan_mask_matches_oracle():
    gamma = torch.tensor([-0.25, -0.5], dtype=torch.float64)
    got = manhattan_decay_mask(gamma, 3, 4)
    for hi in range(2):
        np.testing.assert_allclose(got[hi].numpy(), oracle.manhattan_mask(gamma[hi].item(), 3, 4))
    # constant polyline decays reproduce the Manhattan mask in both path orders
    la = gamma[None, :, None, None].expand(1, 2, 3, 4)
    torch.testing.assert_close(polyline_mask(la, la, form='v2h')[0], got)
    torch.testing.assert_close(polyline_mask(la, la, form='h2v')[0], got)


def test_segment_sum_gradient_follows_index_order():
    # release convention: segment (s, t) = C[max] - C[min], so d/dC is +1 at max and -1 at min, also
    # where C is flat (la == 0) and -|C[t] - C[s]| would have no gradient.
    c = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    segment_sum(c)[2, 0].backward()
    assert c.grad.tolist() == [-1.0, 0.0, 1.0]


def test_very_negative_decays_stay_finite():
    la, lb = decays(1, 2, 9, 70, offset=1e4)
    x = torch.randn(1, 2, 9, 70, 3, dtype=torch.float32, requires_grad=True)
    for form in ('v2h', 'h2v'):
        y = polyline_mask_matvec(x, la.float().requires_grad_(), lb.float(), form=form)
        assert torch.isfinite(y).all()
        y.sum().backward()
        assert torch.isfinite(x.grad).all()
        torch.testing.assert_close(y, x)  # nothing propagates: L = identity


@pytest.mark.parametrize('hw', [(1, 1), (1, 7), (5, 1), (4, 6)])
def test_mask_rows_for_queries_equal_the_dense_rows(hw):
    h, w = hw
    la, lb = decays(2, 3, h, w, seed=11)
    queries = sorted({0, h * w - 1, (h // 2) * w + w // 3})
    for form in ('v2h', 'h2v', '2d'):
        for space in ('log', 'linear'):
            dense = polyline_mask(la, lb, form=form, space=space)
            got = polyline_mask(la, lb, form=form, space=space, queries=queries)
            torch.testing.assert_close(got, dense[:, :, queries], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match='queries'):
        polyline_mask(la, lb, queries=[h * w])
