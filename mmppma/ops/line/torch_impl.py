"""Line attention, torch path: the softmax along image rows or columns with the 1-D segment-sum bias
``seg(c)[t, s] = c[max(t, s)] - c[min(t, s)]`` of a line's decay table ``c`` (the halves of criss-cross attention),
built in place from the O(L) table, its gradient reduced straight back into the table."""
import torch

from ..masks import sign_table
from ..torch_support import pad_last, padded, softmax_


class SegmentMaskedSoftmax(torch.autograd.Function):
    """``softmax(scores + seg(c))`` along the last dim, with ``seg(c)[t, s] = c[max] - c[min]``.

    scores: (..., L, L) (consumed, on CPU overwritten: a fresh matmul output); c: (..., L), a cumsum along the
    line. The bias is added in place from the O(L) table and only the probabilities are saved; the backward
    reduces the bias gradient straight into ``c`` (``+sign * ds`` at the later index, ``-`` at the earlier one).
    """

    @staticmethod
    def forward(ctx, scores, c):
        if scores.device.type == 'cpu' and not torch.compiler.is_compiling():
            # eager CPU: all in place, the probabilities take the scores' storage (compiled code plans its
            # own buffers, and dynamo traces an autograd.Function only if it marks no input dirty)
            probs = segment_softmax_(scores, c)
            ctx.mark_dirty(scores)
        else:
            probs = segment_softmax(scores, c)
        ctx.save_for_backward(probs, c)
        return probs

    @staticmethod
    def backward(ctx, grad):
        probs, c = ctx.saved_tensors
        ds = torch._softmax_backward_data(grad, probs, -1, probs.dtype)  # probs may be needed again
        return ds, segment_table_grad(ds, c) if ctx.needs_input_grad[1] else None


def segment_table_grad(ds: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The gradient of the table ``c`` of ``seg(c)`` from the score gradient ``ds`` (left as it was): the sign
    multiplied in place and back (exact), since a second ds-sized tensor costs more (page faults of a fresh
    allocation) than the two passes over ds."""
    sign = sign_table(c.shape[-1], c.dtype, c.device)
    signed = ds.mul_(sign)
    dc = signed.sum(-1) - signed.sum(-2)
    signed.mul_(sign)
    return dc


def segment_bias(length: int, dtype: torch.dtype, device: torch.device):
    """``add(s, c)``: scores s (..., L, L) plus ``seg(c)`` of the line tables c (..., L) for lines of ``length``,
    out of place, as ``sign * (c[t] - c[u])``."""
    sign = sign_table(length, dtype, device)
    return lambda s, c: s + (c.unsqueeze(-1) - c.unsqueeze(-2)) * sign


def segment_softmax(scores: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``softmax(scores + seg(c))`` of :class:`SegmentMaskedSoftmax` in plain, out-of-place ops."""
    return segment_bias(c.shape[-1], c.dtype, c.device)(scores, c).softmax(-1)


def segment_softmax_(scores: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The forward of :class:`SegmentMaskedSoftmax` in the storage of ``scores`` (no autograd)."""
    sign = sign_table(c.shape[-1], c.dtype, c.device)
    return softmax_(scores.addcmul_(c.unsqueeze(-1), sign).addcmul_(c.unsqueeze(-2), sign, value=-1.0))


def segment_softmax_backward_(grad: torch.Tensor, probs: torch.Tensor, c: torch.Tensor, table_grad: bool):
    """(score gradient, table gradient or None) of :class:`SegmentMaskedSoftmax`; the score gradient takes
    ``grad``'s storage (a tensor of the caller's own)."""
    ds = torch.ops.aten._softmax_backward_data.out(grad, probs, -1, probs.dtype, grad_input=grad)
    return ds, segment_table_grad(ds, c) if table_grad else None


def padded_segment_bias(c: torch.Tensor, dtype: torch.dtype):
    """``add(s, i0, i1, n0, n1)``: ``s[..., t, u] += sign[t, u] * (c[t] - c[u])`` as :class:`SegmentMaskedSoftmax`,
    for images [i0, i1) and heads [n0, n1) of ``c`` (B, heads, lines, L), in place, on score rows :func:`padded`
    past L: there sign is +1 and c[u] is +inf, so the padding gets -inf."""
    length = c.shape[-1]
    sign = pad_last(sign_table(length, dtype, c.device), padded(length, c.device), 1.0)
    c_keys = pad_last(c, padded(length, c.device), float('inf'))

    def add(s, i0, i1, n0, n1):
        s.addcmul_(c[i0:i1, n0:n1].unsqueeze(-1), sign)
        return s.addcmul_(c_keys[i0:i1, n0:n1].unsqueeze(-2), sign, value=-1.0)
    return add
