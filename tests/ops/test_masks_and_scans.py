"""Dense polyline masks, the decay scan and the mask-vector products (Algorithm 1) against the loop oracle."""
import numpy as np
import pytest
import torch

from mmppma import ops

from . import oracle
from .oracle import decays

SHAPES = [(1, 1), (1, 9), (9, 1), (7, 7), (13, 17), (14, 14)]


@pytest.mark.parametrize('hw', SHAPES)
def test_mask_and_matvec_match_loop_oracle(hw):
    h, w = hw
    la, lb = decays(2, 2, h, w, seed=h * 100 + w)
    m = oracle.apply_per_head(oracle.mask_v2h, la.numpy(), lb.numpy())
    mt = np.swapaxes(m, -1, -2)
    l2d = np.exp(m) + np.exp(mt)
    for form, space, want in (('v2h', 'log', m), ('h2v', 'log', mt), ('v2h', 'linear', np.exp(m)),
                              ('2d', 'linear', l2d), ('2d', 'log', np.log(l2d))):
        np.testing.assert_allclose(ops.polyline_mask(la, lb, form=form, space=space).numpy(), want, rtol=1e-12,
                                   atol=1e-12)
    # one slice of depth one (no decay along D): the 3D mask is the 2D one
    torch.testing.assert_close(ops.polyline_mask_3d(la[:, :, None], lb[:, :, None], torch.zeros_like(la)[:, :, None]),
                               ops.polyline_mask(la, lb, form='v2h'))
    x = torch.randn(2, 2, h, w, 5, dtype=torch.float64)
    xf = x.numpy().reshape(2, 2, h * w, 5)
    for chunk in (3, 64):
        for form, lmask, atol in (('v2h', np.exp(m), 1e-12), ('h2v', np.exp(mt), 1e-12), ('2d', l2d, 0)):
            got = ops.polyline_mask_matvec(x, la, lb, form=form, chunk=chunk).numpy().reshape(2, 2, h * w, 5)
            np.testing.assert_allclose(got, lmask @ xf, rtol=1e-10, atol=atol, err_msg=f'{form} chunk {chunk}')


def test_mask_is_product_of_decays_on_a_hand_example():
    # 2 x 2 map: from (0, 0) to (1, 1) the V2H path goes right along row 0 (exp la[0, 1]) then down column 1
    # (exp lb[1, 1]); H2V goes down column 0 (exp lb[1, 0]) then right along row 1 (exp la[1, 1])
    la = torch.log(torch.tensor([[0.9, 0.8], [0.7, 0.6]], dtype=torch.float64))[None, None]
    lb = torch.log(torch.tensor([[0.5, 0.4], [0.3, 0.2]], dtype=torch.float64))[None, None]
    lmask = ops.polyline_mask(la, lb, form='v2h', space='linear')[0, 0]
    assert lmask[0, 3].item() == pytest.approx(0.8 * 0.2)
    assert lmask[3, 0].item() == pytest.approx(0.6 * 0.3)  # from (1,1): left along row 1, up column 0
    assert ops.polyline_mask(la, lb, form='h2v', space='linear')[0, 0, 0, 3].item() == pytest.approx(0.3 * 0.6)
    assert torch.allclose(lmask.diagonal(), torch.ones(4, dtype=torch.float64))


def test_decay_tables_are_float32_for_half_inputs():
    la, lb = decays(1, 2, 3, 5, dtype=torch.float16)
    ca, cb = ops.decay_tables(la, lb)
    assert ca.dtype == torch.float32 and cb.dtype == torch.float32
    torch.testing.assert_close(ca, la.float().cumsum(-1))
    torch.testing.assert_close(cb, lb.float().cumsum(-2))


@pytest.mark.parametrize('length', [1, 5, 63, 64, 65, 200])
@pytest.mark.parametrize('chunk', [4, 7, 64])
def test_decay_scan_1d_matches_dense(length, chunk):
    g = torch.Generator().manual_seed(length)
    x = torch.randn(3, length, 4, generator=g, dtype=torch.float64)
    log_decay = -torch.rand(3, length, generator=g, dtype=torch.float64)
    dense = np.exp([[[oracle.seg(line, t, s) for s in range(length)] for t in range(length)]
                    for line in log_decay.numpy()])
    np.testing.assert_allclose(ops.decay_scan_1d(x, log_decay, chunk=chunk).numpy(), dense @ x.numpy(), rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize('dhw', [(1, 1, 1), (2, 3, 4), (3, 1, 5), (4, 3, 2)])
def test_3d_mask_and_matvec(dhw):
    g = torch.Generator().manual_seed(sum(dhw))
    la, lb, lc = (-torch.rand(1, 2, *dhw, generator=g, dtype=torch.float64) for _ in range(3))
    want = oracle.apply_per_head(oracle.mask_3d, la.numpy(), lb.numpy(), lc.numpy())
    np.testing.assert_allclose(ops.polyline_mask_3d(la, lb, lc).numpy(), want, atol=1e-12)
    x = torch.randn(1, 2, *dhw, 3, generator=g, dtype=torch.float64)
    got = ops.polyline_mask_matvec_3d(x, la, lb, lc, chunk=2).numpy().reshape(1, 2, -1, 3)
    np.testing.assert_allclose(got, np.exp(want) @ x.numpy().reshape(1, 2, -1, 3), rtol=1e-10, atol=1e-12)


def test_manhattan_mask_matches_oracle_and_constant_polyline_decays():
    log_decay = torch.tensor([-0.25, -0.5], dtype=torch.float64)
    got = ops.manhattan_decay_mask(log_decay, 3, 4)
    for hi in range(2):
        np.testing.assert_allclose(got[hi].numpy(), oracle.manhattan_mask(log_decay[hi].item(), 3, 4))
    la = log_decay[None, :, None, None].expand(1, 2, 3, 4)
    for form in ('v2h', 'h2v'):
        torch.testing.assert_close(ops.polyline_mask(la, la, form=form)[0], got)


def test_segment_sum_gradient_follows_index_order():
    # segment (s, t) = C[max] - C[min]: d/dC is +1 at max and -1 at min, also where C is flat (la == 0) and
    # -|C[t] - C[s]| would have no gradient
    c = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    ops.segment_sum(c)[2, 0].backward()
    assert c.grad.tolist() == [-1.0, 0.0, 1.0]


def test_very_negative_decays_stay_finite():
    la, lb = decays(1, 2, 9, 70, offset=1e4)
    x = torch.randn(1, 2, 9, 70, 3, dtype=torch.float32, requires_grad=True)
    for form in ('v2h', 'h2v'):
        y = ops.polyline_mask_matvec(x, la.float().requires_grad_(), lb.float(), form=form)
        y.sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
        torch.testing.assert_close(y, x)  # nothing propagates: L = identity


@pytest.mark.parametrize('hw', [(1, 1), (1, 7), (5, 1), (4, 6)])
def test_mask_rows_for_queries_equal_the_dense_rows(hw):
    h, w = hw
    la, lb = decays(2, 3, h, w, seed=11)
    queries = sorted({0, h * w - 1, (h // 2) * w + w // 3})
    for form in ('v2h', 'h2v', '2d'):
        for space in ('log', 'linear'):
            torch.testing.assert_close(ops.polyline_mask(la, lb, form=form, space=space, queries=queries),
                                       ops.polyline_mask(la, lb, form=form, space=space)[:, :, queries], rtol=1e-12,
                                       atol=1e-12)
    with pytest.raises(ValueError, match='queries'):
        ops.polyline_mask(la, lb, queries=[h * w])
