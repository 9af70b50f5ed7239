"""The torch.library ops of the torch path (``mmppma::whole_attention_blockwise`` and its backward,
``mmppma::tokens_to_nchw``): schema, fake implementations, autograd registration and dynamic-shape tracing checked
by ``torch.library.opcheck``."""
import pytest
import torch

from mmppma.ops.masks import column_segment_sums, manhattan_segment_sums, row_segment_sums

from .test_masks_and_scans import decays

BLOCKWISE = torch.ops.mmppma.whole_attention_blockwise
BLOCKWISE_BACKWARD = torch.ops.mmppma.whole_attention_blockwise_backward


def _inputs(b, heads, h, w, d, dv, dtype=torch.float64, table_batch=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, heads, h * w, d, generator=g, dtype=dtype, requires_grad=True) for _ in range(2))
    v = torch.randn(b, heads, h * w, dv, generator=g, dtype=dtype, requires_grad=True)
    la, lb = decays(table_batch or b, heads, h, w, seed=seed + 1)
    sa = row_segment_sums(la).to(dtype).requires_grad_()
    sb = column_segment_sums(lb).to(dtype).requires_grad_()
    return q, k, v, sa, sb


@pytest.mark.parametrize('form', ['release', 'v2h', 'h2v'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_blockwise_op_passes_opcheck(form, dtype):
    q, k, v, sa, sb = _inputs(2, 2, 3, 5, 4, 3, dtype)
    torch.library.opcheck(BLOCKWISE, (q, k, v, sa, sb, form))


def test_blockwise_op_passes_opcheck_with_tables_broadcast_over_batch():
    """The Manhattan tables: one per head, broadcast (stride 0) over the batch and the image rows."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4 * 6, 5, generator=g, dtype=torch.float64) for _ in range(3))
    sa, sb = manhattan_segment_sums(-torch.rand(3, generator=g, dtype=torch.float64), 4, 6, torch.float64)
    torch.library.opcheck(BLOCKWISE, (q, k, v, sa, sb, 'v2h'))


@pytest.mark.parametrize('table_grads', [True, False])
def test_blockwise_backward_op_passes_opcheck(table_grads):
    q, k, v, sa, sb = _inputs(2, 2, 4, 3, 4, 2, table_batch=1)
    dout = torch.randn(2, 2, 12, 2, dtype=torch.float64)
    args = (dout, q.detach(), k.detach(), v.detach(), sa.detach(), sb.detach(), 'release', table_grads)
    # no autograd registration: a backward op is not differentiated again
    torch.library.opcheck(BLOCKWISE_BACKWARD, args, test_utils=('test_schema', 'test_faketensor',
                                                                 'test_aot_dispatch_dynamic'))
    dq, dk, dv, dsa, dsb = BLOCKWISE_BACKWARD(*args)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    if table_grads:
        assert dsa.shape == sa.shape and dsb.shape == sb.shape
    else:
        assert dsa.numel() == 0 and dsb.numel() == 0


def test_tokens_to_nchw_op_is_a_channels_last_copy_and_passes_opcheck():
    """The conv input op the layers use while compiling: the permuted tokens' values in a tensor of its own."""
    from mmppma.models.layers.conv import tokens_to_nchw
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    y = tokens_to_nchw(x)
    assert y.shape == (2, 4, 3, 5) and y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, x.detach().permute(0, 3, 1, 2)) and y.data_ptr() != x.data_ptr()
    grad = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    y.backward(grad)
    assert torch.equal(x.grad, grad.permute(0, 2, 3, 1))
    torch.library.opcheck(torch.ops.mmppma.tokens_to_nchw, (x.detach().requires_grad_(), ))
