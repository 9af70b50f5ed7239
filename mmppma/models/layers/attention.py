"""The token mixer of a PPMA/RMT block (``retention`` in the release; docs/method.md §3).

q, k, v, out: Linear(C, C) with bias; k scaled by d^-0.5; 2D-raster RoPE on q and k; LePE (depthwise 5x5
conv on v) added after attention. The attention itself is one of the ``mmppma.ops`` functions, chosen by
``attn_type`` (whole / criss-cross) and ``mask`` (the paper's Table 4 variants):

========== ======================================== =============================================
mask       whole stages                             criss-cross stages
========== ======================================== =============================================
polyline   ppma_attention(form=release|paper)       criss_cross_attention(form='release')
shared     same, one learned decay (la == lb)       same, la == lb
v2h        ppma_attention(form='v2h')               criss_cross_attention(form='v2h')
rmt        manhattan_attention (fixed decay)        rmt_criss_cross_attention (rows, then columns)
none       softmax(q k^T) v                         criss_cross_attention(0, 0, form='release')
========== ======================================== =============================================

:meth:`PolylinePathAttention.query_maps` returns the mask and the attention weights of given query tokens.
"""
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmppma.ops import (
    criss_cross_attention,
    manhattan_attention,
    polyline_mask,
    ppma_attention,
    rmt_criss_cross_attention,
)
from mmppma.utils.checks import check_choice

from .conv import DWConv2d
from .inplace import records_grad
from .path_embed import PathEmbed
from .rope import PositionTables, apply_rope

PPMA_ATTN_TYPES = ('criss_cross', 'whole')
PPMA_MASKS = ('polyline', 'shared', 'v2h', 'none', 'rmt')
PPMA_FORMS = ('release', 'paper')


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T) v over all H*W tokens (no mask; k pre-scaled): (B, n, H, W, d) -> (B, n, H, W, d_v)."""
    out = F.scaled_dot_product_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3), scale=1.0)
    return out.unflatten(2, q.shape[2:4])


class PolylinePathAttention(nn.Module):
    """Masked attention on channels-last tokens: (B, H, W, C) -> (B, H, W, C).

    Args:
        embed_dims: C.
        num_heads: n; head_dims = C / n.
        attn_type: 'whole' (N x N per head, PPMVA) or 'criss_cross' (rows and columns, PPMCCA).
        mask: 'polyline' (default), 'shared', 'v2h', 'none' or 'rmt' (see the module docstring).
        form: whole stages with a learned mask: 'release' (0.5 softmax(S+M)v + 0.5 softmax(S+M^T)v,
            what the checkpoints were trained with) or 'paper' ((softmax(S) * L2D) v).
        impl: the ops' implementation ('auto' | 'torch' | 'triton' | 'reference').
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 attn_type: str = 'whole',
                 mask: str = 'polyline',
                 form: str = 'release',
                 impl: str = 'auto') -> None:
        super().__init__()
        check_choice('attn_type', attn_type, PPMA_ATTN_TYPES)
        check_choice('mask', mask, PPMA_MASKS)
        check_choice('form', form, PPMA_FORMS)
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.head_dims = embed_dims // num_heads
        self.scaling = self.head_dims**-0.5
        self.attn_type, self.mask, self.form, self.impl = attn_type, mask, form, impl

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
        v = self.v_proj(x)
        lepe = self.lepe(v)
        q, k = self.queries_keys(x, pos)
        out = self._attend(q, k, self._heads(v), x, pos)  # (B, n, H, W, d)
        out = out.permute(0, 2, 3, 1, 4)  # (B, H, W, n, d)
        if records_grad(lepe) or records_grad(out) or out.dtype != lepe.dtype:
            return self.out_proj(out.reshape(b, h, w, c) + lepe)
        # inference: out + lepe into the conv's output, reading out in its own layout (no copy)
        return self.out_proj(lepe.unflatten(-1, (self.num_heads, self.head_dims)).add_(out).flatten(-2))

    def queries_keys(self, x: torch.Tensor, pos: PositionTables) -> Tuple[torch.Tensor, torch.Tensor]:
        """The attention's q and k (B, n, H, W, d) for input tokens x (B, H, W, C): projected, k scaled by
        d^-0.5, both rotated by the RoPE tables ``pos``."""
        q = self.q_proj(x)
        k = self.k_proj(x)
        k = k * self.scaling if records_grad(k) else k.mul_(self.scaling)
        sin, cos = pos.sin.to(q.dtype), pos.cos.to(q.dtype)
        return self._rotated_heads(q, sin, cos), self._rotated_heads(k, sin, cos)

    def _rotated_heads(self, t: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        """Projected tokens t (B, H, W, C) as heads (B, n, H, W, d) rotated by the RoPE tables (H, W, d). In eager
        inference the rotation runs in t's own storage before the heads are split off (contiguous passes). While
        torch.compile traces, the heads are rotated: inductor fuses the rotation into one kernel anyway, and its
        attention pattern rewrite fails on 5-D permuted views of the tokens taken as queries."""
        if records_grad(t) or torch.compiler.is_compiling():
            return apply_rope(self._heads(t), sin, cos)
        heads = t.unflatten(-1, (self.num_heads, self.head_dims))
        return self._heads(apply_rope(heads, sin.unsqueeze(-2), cos.unsqueeze(-2), inplace=True).flatten(-2))

    def _decays(self, x: torch.Tensor, pos: PositionTables) -> Tuple[torch.Tensor, ...]:
        """What the mask reads: (la, lb) (B, n, H, W) learned from x, (log_decay,) (n,) for 'rmt', () for 'none'."""
        if self.path_embed is not None:
            return self.path_embed(x)
        return (pos.log_decay, ) if self.mask == 'rmt' else ()

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor,
                pos: PositionTables) -> torch.Tensor:
        """q, k, v (B, n, H, W, d) -> (B, n, H, W, d); decays from the normalized tokens x (B, H, W, C)."""
        decays = self._decays(x, pos)
        if self.attn_type == 'whole':
            return self.whole_attention(q, k, v, *decays)
        impl = self.impl
        if self.mask == 'rmt':
            # == criss_cross_attention(q, k, v, la, la, form='h2v') with la the decay broadcast to
            # (B, n, H, W); this op builds the constant biases once per head instead of per position.
            return rmt_criss_cross_attention(q, k, v, *decays, scale=1.0, impl=impl)
        if not decays:
            decays = (q.new_zeros((), dtype=torch.float32).expand(q.shape[:-1]), ) * 2
        form = 'v2h' if self.mask == 'v2h' else 'release'
        return criss_cross_attention(q, k, v, *decays, scale=1.0, form=form, impl=impl)

    def whole_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *decays: torch.Tensor) -> torch.Tensor:
        """This layer's whole (N x N) attention: q, k, v (B, n, H, W, d) -> (B, n, H, W, d), ``decays`` as
        :meth:`_decays` gives them. Every tensor it reads is an argument, so a FLOP counter can trace it as one
        node (:func:`mmppma.models.utils.flops.count_flops`)."""
        if self.path_embed is not None:
            form = 'v2h' if self.mask == 'v2h' else self.form
            return ppma_attention(q, k, v, *decays, scale=1.0, form=form, impl=self.impl)
        if self.mask == 'rmt':
            return manhattan_attention(q, k, v, *decays, scale=1.0, impl=self.impl)
        return plain_attention(q, k, v)

    def log_decays(self, x: torch.Tensor, pos: PositionTables) -> Tuple[torch.Tensor, torch.Tensor]:
        """The mask's log-decays (la, lb) on x's token grid, (B, n, H, W) float32: learned from x, RMT's fixed
        per-head decay broadcast, or zeros (mask 'none')."""
        decays = self._decays(x, pos)
        if len(decays) == 2:
            return decays
        b, h, w, _ = x.shape
        log_decay = decays[0].float() if decays else x.new_zeros(self.num_heads, dtype=torch.float32)
        la = log_decay.reshape(1, self.num_heads, 1, 1).expand(b, -1, h, w)
        return la, la

    @torch.no_grad()
    def query_maps(self, x: torch.Tensor, pos: PositionTables,
                   queries: Sequence[Tuple[int, int]]) -> Dict[str, torch.Tensor]:
        """Maps over all keys for the query tokens ``queries`` ((i, j) pairs on x's grid), each
        (B, n, Q, H, W) float32, for input tokens x (B, H, W, C) and position tables ``pos``:

        * ``'mask'``: the path mask from the query to each key: L2D = exp(M) + exp(M^T) (masks 'polyline',
          'shared'), exp(M) ('v2h'; 'rmt', whose Manhattan mask is symmetric), ones ('none'); for
          criss-cross stages the 2D mask of the same decays (their attention reaches it in two steps);
        * ``'attention'``: the weights this layer's attention gives each key (it is linear in v: applied to
          one-hot values), exact for every ``attn_type`` and ``mask``;
        * ``'unmasked'``: softmax(q k^T) over all keys, without a mask.
        """
        b, h, w, _ = x.shape
        for i, j in queries:
            if not (0 <= i < h and 0 <= j < w):
                raise ValueError(f'query ({i}, {j}) is outside the {h} x {w} token grid')
        index = [i * w + j for i, j in queries]
        q, k = self.queries_keys(x, pos)
        la, lb = self.log_decays(x, pos)
        form = '2d' if self.mask in ('polyline', 'shared') else 'v2h'
        mask = polyline_mask(la, lb, form=form, space='linear', queries=index)
        qs = q.flatten(2, 3)[:, :, index].float()  # (B, n, Q, d)
        unmasked = (qs @ k.flatten(2, 3).float().transpose(-1, -2)).softmax(-1)
        one_hot = torch.eye(h * w, dtype=q.dtype, device=q.device).view(1, 1, h, w, h * w)
        weights = self._attend(q, k, one_hot.expand(b, self.num_heads, h, w, h * w).contiguous(), x, pos)
        attention = weights.flatten(2, 3)[:, :, index].float()  # (B, n, Q, N)
        return {name: t.unflatten(-1, (h, w)) for name, t in
                (('mask', mask.float()), ('attention', attention), ('unmasked', unmasked))}

    def extra_repr(self) -> str:
        return (f'embed_dims={self.embed_dims}, num_heads={self.num_heads}, attn_type={self.attn_type!r}, '
                f'mask={self.mask!r}, form={self.form!r}, impl={self.impl!r}')
