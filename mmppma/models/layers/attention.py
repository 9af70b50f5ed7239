"""The token mixer of a PPMA/RMT block (``retention`` in the release; REFERENCE 3).

q, k, v, out: Linear(C, C) with bias; k scaled by d^-0.5; 2D-raster RoPE on q and k; LePE (depthwise 5x5
conv on v) added after attention. The attention itself is one of the ``mmppma.ops`` functions, chosen by
``attn_type`` (whole / criss-cross) and ``mask`` (the paper's Table 4 variants):

========== ======================================== =============================================
mask       whole stages                             criss-cross stages
========== ======================================== =============================================
polyline   ppma_attention(form=release|paper)       criss_cross_attention(order='both')
shared     same, one learned decay (la == lb)       same, la == lb
v2h        ppma_attention(form='v2h')               criss_cross_attention(order='col_row') (V2H)
rmt        manhattan_attention (fixed decay)        rmt_criss_cross_attention (rows, then columns)
none       softmax(q k^T) v                         criss_cross_attention(0, 0, order='both')
========== ======================================== =============================================

(``Aw(Ah v)`` mixes a key (k, l) down its column to row i, then along row i: the V2H path M of REFERENCE 2.)
"""
import contextlib
from typing import Callable, Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.ops import criss_cross_attention, manhattan_attention, ppma_attention, rmt_criss_cross_attention

from .conv import DWConv2d
from .inplace import records_grad
from .path_embed import PathEmbed
from .rope import PositionTables, apply_rope

ATTN_TYPES = ('criss_cross', 'whole')
MASKS = ('polyline', 'shared', 'v2h', 'none', 'rmt')
ATTN_FORMS = ('release', 'paper')


_COUNTING_FLOPS = False


@contextlib.contextmanager
def whole_attention_as_one_op() -> Iterator[None]:
    """While active, whole attention runs inside :class:`WholeAttentionForFlops`, so a jit trace (mmengine's
    FLOP counter) records it as one node however the op computes it internally (blockwise, dense, ...)."""
    global _COUNTING_FLOPS
    previous, _COUNTING_FLOPS = _COUNTING_FLOPS, True
    try:
        yield
    finally:
        _COUNTING_FLOPS = previous


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]],
                  torch.Tensor]


class WholeAttentionForFlops(torch.autograd.Function):
    """Forward-only wrapper used by :func:`whole_attention_as_one_op`: traced as
    ``prim::PythonOp.WholeAttentionForFlops`` with inputs q, k, v (B, heads, H, W, d) first. Every tensor the op
    reads is an input (a traced closure over tensors breaks the jit tracer)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: Optional[torch.Tensor],
                b: Optional[torch.Tensor], attend: Attend) -> torch.Tensor:
        return attend(q, k, v, a, b)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError('WholeAttentionForFlops is for FLOP counting only (no backward)')


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T) v over all H*W tokens (no mask; k pre-scaled): (B, n, H, W, d) -> (B, n, H, W, d_v)."""
    out = F.scaled_dot_product_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3), scale=1.0)
    return out.unflatten(2, q.shape[2:4])


def check_choice(name: str, value: str, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f'{name}={value!r} is not supported; choose one of {", ".join(map(repr, choices))}')


class PolylinePathAttention(nn.Module):
    """Masked attention on channels-last tokens: (B, H, W, C) -> (B, H, W, C).

    Args:
        embed_dims: C.
        num_heads: n; head_dims = C / n.
        attn_type: 'whole' (N x N per head, PPMVA) or 'criss_cross' (rows and columns, PPMCCA).
        mask: 'polyline' (default), 'shared', 'v2h', 'none' or 'rmt' (see the module docstring).
        attn_form: whole stages with a learned mask: 'release' (0.5 softmax(S+M)v + 0.5 softmax(S+M^T)v,
            what the checkpoints were trained with) or 'paper' ((softmax(S) * L2D) v).
        impl: the ops' implementation ('auto' | 'torch' | 'triton' | 'reference').
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 attn_type: str = 'whole',
                 mask: str = 'polyline',
                 attn_form: str = 'release',
                 impl: str = 'auto') -> None:
        super().__init__()
        check_choice('attn_type', attn_type, ATTN_TYPES)
        check_choice('mask', mask, MASKS)
        check_choice('attn_form', attn_form, ATTN_FORMS)
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.head_dims = embed_dims // num_heads
        self.scaling = self.head_dims**-0.5
        self.attn_type, self.mask, self.attn_form, self.impl = attn_type, mask, attn_form, impl

        self.q_proj = nn.Linear(embed_dims, embed_dims)
        self.k_proj = nn.Linear(embed_dims, embed_dims)
        self.v_proj = nn.Linear(embed_dims, embed_dims)
        self.lepe = DWConv2d(embed_dims, 5)
        self.out_proj = nn.Linear(embed_dims, embed_dims)
        self.path_embed: Optional[PathEmbed] = None
        if mask in ('polyline', 'v2h', 'shared'):
            self.path_embed = PathEmbed(num_heads, self.head_dims, directions=1 if mask == 'shared' else 2)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) -> (B, n, H, W, d)."""
        b, h, w, _ = t.shape
        return t.view(b, h, w, self.num_heads, self.head_dims).permute(0, 3, 1, 2, 4)

    def forward(self, x: torch.Tensor, pos: PositionTables) -> torch.Tensor:
        b, h, w, c = x.shape
        q = self.q_proj(x)
        k = self.k_proj(x)
        k = k * self.scaling if records_grad(k) else k.mul_(self.scaling)
        v = self.v_proj(x)
        lepe = self.lepe(v)

        sin, cos = pos.sin.to(q.dtype), pos.cos.to(q.dtype)
        q = apply_rope(self._heads(q), sin, cos)
        k = apply_rope(self._heads(k), sin, cos)
        v = self._heads(v)
        out = self._attend(q, k, v, x, pos)  # (B, n, H, W, d)
        out = out.permute(0, 2, 3, 1, 4)  # (B, H, W, n, d)
        if records_grad(lepe) or records_grad(out) or out.dtype != lepe.dtype:
            return self.out_proj(out.reshape(b, h, w, c) + lepe)
        # inference: out + lepe into the conv's output, reading out in its own layout (no copy)
        return self.out_proj(lepe.unflatten(-1, (self.num_heads, self.head_dims)).add_(out).flatten(-2))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor,
                pos: PositionTables) -> torch.Tensor:
        """q, k, v (B, n, H, W, d) -> (B, n, H, W, d); decays from the normalized tokens x (B, H, W, C)."""
        impl = self.impl
        if self.attn_type == 'criss_cross':
            if self.path_embed is not None:
                la, lb = self.path_embed(x)
                order = 'col_row' if self.mask == 'v2h' else 'both'
                return criss_cross_attention(q, k, v, la, lb, scale=1.0, order=order, impl=impl)
            if self.mask == 'rmt':
                # == criss_cross_attention(q, k, v, g, g, order='row_col') with g the decay broadcast to
                # (B, n, H, W); this op builds the constant biases once per head instead of per position.
                return rmt_criss_cross_attention(q, k, v, pos.log_decay, scale=1.0, impl=impl)
            zero = q.new_zeros((), dtype=torch.float32).expand(q.shape[:-1])
            return criss_cross_attention(q, k, v, zero, zero, scale=1.0, order='both', impl=impl)

        # attend(q, k, v, la, lb): the decays are arguments, not closed over, for WholeAttentionForFlops
        attend: Attend
        la = lb = None
        if self.path_embed is not None:
            la, lb = self.path_embed(x)
            form = 'v2h' if self.mask == 'v2h' else self.attn_form
            attend = lambda q, k, v, la, lb: ppma_attention(  # noqa: E731
                q, k, v, la, lb, scale=1.0, form=form, impl=impl)
        elif self.mask == 'rmt':
            la = pos.log_decay
            attend = lambda q, k, v, g, _: manhattan_attention(q, k, v, g, scale=1.0, impl=impl)  # noqa: E731
        else:
            attend = lambda q, k, v, _a, _b: plain_attention(q, k, v)  # noqa: E731
        if _COUNTING_FLOPS:
            return WholeAttentionForFlops.apply(q, k, v, la, lb, attend)
        return attend(q, k, v, la, lb)

    def extra_repr(self) -> str:
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, attn_type={self.attn_type!r}, '
                f'mask={self.mask!r}, attn_form={self.attn_form!r}, impl={self.impl!r}')
