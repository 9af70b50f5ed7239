"""The token mixer of a PPMA/RMT block (``retention`` in the release; docs/method.md §3).

q, k, v, out: Linear(C, C) with bias; k scaled by d^-0.5; 2D-raster RoPE on q and k; LePE (depthwise 5x5
conv on v) added after attention. The attention itself is one of the ``mmppma.ops`` functions, chosen once, at
construction, by three settings, each with one name from the config to the op:

* ``attn_type`` (the arch's per-stage ``attn_types``): ``'whole'`` or ``'criss_cross'``, the op family
  (``mmppma.ops.whole`` / ``mmppma.ops.criss_cross``);
* ``mask``: what the path mask's decays are (paper Table 4): ``'polyline'`` (learned, horizontal and vertical),
  ``'shared'`` (learned, one for both directions), ``'rmt'`` (RMT's fixed per-head decay), ``'none'``;
* ``form``: the ops' ``form`` (:mod:`mmppma.ops.forms`) of a learned mask: ``'release'`` (default), ``'paper'``
  (whole attention only) or ``'v2h'`` (the V2H path only).

========== ================================== ==========================================================
mask       whole stages                       criss-cross stages
========== ================================== ==========================================================
polyline   ppma_attention(form=form)          criss_cross_attention(form=form)
shared     same, one learned decay (la == lb) same, la == lb
rmt        manhattan_attention (fixed decay)  rmt_criss_cross_attention (rows, then columns)
none       softmax(q k^T) v                   criss_cross_attention(0, 0, form='release')
========== ================================== ==========================================================

:func:`check_variant` is the one check of these settings (the backbone calls it with its config's).
:meth:`PolylinePathAttention.query_maps` returns the mask and the attention weights of given query tokens.
"""
import functools
from typing import Callable, Dict, Optional, Sequence, Tuple

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
PPMA_MASKS = ('polyline', 'shared', 'none', 'rmt')
#: the masks with learned decays (a ``PathEmbed``), the only ones a ``form`` other than 'release' applies to
LEARNED_MASKS = ('polyline', 'shared')
#: the ops' forms a PPMA layer takes (``'paper'``: whole attention only)
PPMA_FORMS = ('release', 'paper', 'v2h')


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, impl: str = 'auto') -> torch.Tensor:
    """softmax(q k^T) v over all H*W tokens (no mask; k pre-scaled): (B, n, H, W, d) -> (B, n, H, W, d_v).
    ``impl`` is not used: torch's scaled_dot_product_attention picks its own kernel."""
    out = F.scaled_dot_product_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3), scale=1.0)
    return out.unflatten(2, q.shape[2:4])


def criss_cross_without_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, impl: str) -> torch.Tensor:
    """Criss-cross attention with no mask: zero decays, both orders averaged (form 'release')."""
    zeros = q.new_zeros((), dtype=torch.float32).expand(q.shape[:-1])
    return criss_cross_attention(q, k, v, zeros, zeros, scale=1.0, form='release', impl=impl)


#: (attn_type, 'learned' | 'rmt' | 'none', form) -> the op, called as ``op(q, k, v, *decays, impl=impl)`` with
#: the decays :meth:`PolylinePathAttention._decays` gives: the tables (Ca, Cb) learned, (log_decay,) for 'rmt', ()
#: for 'none'.
ATTENTION_OPS: Dict[Tuple[str, str, str], Callable[..., torch.Tensor]] = {
    **{('whole', 'learned', form): functools.partial(ppma_attention, scale=1.0, form=form, tables=True)
       for form in PPMA_FORMS},
    **{('criss_cross', 'learned', form): functools.partial(criss_cross_attention, scale=1.0, form=form, tables=True)
       for form in ('release', 'v2h')},
    ('whole', 'rmt', 'release'): functools.partial(manhattan_attention, scale=1.0),
    ('criss_cross', 'rmt', 'release'): functools.partial(rmt_criss_cross_attention, scale=1.0),
    ('whole', 'none', 'release'): plain_attention,
    ('criss_cross', 'none', 'release'): criss_cross_without_mask,
}


def _op_key(attn_type: str, mask: str, form: str) -> Tuple[str, str, str]:
    return attn_type, 'learned' if mask in LEARNED_MASKS else mask, form


def check_variant(attn_types: Sequence[str], mask: str, form: str) -> None:
    """The one check of a PPMA variant, where the config meets the model: every stage's ``attn_type``, the
    ``mask`` and the ``form``, alone and together (:data:`ATTENTION_OPS`); an error names the setting to change."""
    for i, attn_type in enumerate(attn_types):
        check_choice(f'attn_types[{i}]', attn_type, PPMA_ATTN_TYPES)
    if mask == 'v2h':
        raise ValueError("mask='v2h' is not a mask: the V2H-path-only variant is mask='polyline', form='v2h'")
    check_choice('mask', mask, PPMA_MASKS)
    check_choice('form', form, PPMA_FORMS)
    if form != 'release' and mask not in LEARNED_MASKS:
        raise ValueError(f"form={form!r} applies to a learned mask ({', '.join(LEARNED_MASKS)}); mask={mask!r} "
                         "takes form='release'")
    crossed = [i for i, t in enumerate(attn_types) if _op_key(t, mask, form) not in ATTENTION_OPS]
    if crossed:
        raise ValueError(f"form={form!r} is whole attention's (mmppma.ops.ppma_attention); criss-cross attention "
                         f"has no such form and stages {crossed} are 'criss_cross'. Use form='release', or "
                         "attn_types 'whole' in every stage")


class PolylinePathAttention(nn.Module):
    """Masked attention on channels-last tokens: (B, H, W, C) -> (B, H, W, C).

    Args:
        embed_dims: C.
        num_heads: n; head_dims = C / n.
        attn_type: 'whole' (N x N per head, PPMVA) or 'criss_cross' (rows and columns, PPMCCA).
        mask: 'polyline' (default), 'shared', 'none' or 'rmt' (see the module docstring).
        form: the op's form with a learned mask: 'release' (0.5 softmax(S+M)v + 0.5 softmax(S+M^T)v, what the
            checkpoints were trained with), 'paper' ((softmax(S) * L2D) v; whole attention) or 'v2h' (M only).
        impl: the ops' implementation ('auto' | 'torch' | 'triton' | 'reference').

    The settings are checked where a config meets the model (:func:`check_variant`, called by the backbone);
    the op is picked here, once.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 attn_type: str = 'whole',
                 mask: str = 'polyline',
                 form: str = 'release',
                 impl: str = 'auto') -> None:
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.head_dims = embed_dims // num_heads
        self.scaling = self.head_dims**-0.5
        self.attn_type, self.mask, self.form, self.impl = attn_type, mask, form, impl
        op = ATTENTION_OPS.get(_op_key(attn_type, mask, form))
        if op is None:
            check_variant([attn_type], mask, form)  # raises, naming the setting
        self._op = functools.partial(op, impl=impl)

        self.q_proj = nn.Linear(embed_dims, embed_dims)
        self.k_proj = nn.Linear(embed_dims, embed_dims)
        self.v_proj = nn.Linear(embed_dims, embed_dims)
        self.lepe = DWConv2d(embed_dims, 5)
        self.out_proj = nn.Linear(embed_dims, embed_dims)
        self.path_embed: Optional[PathEmbed] = None
        if mask in LEARNED_MASKS:
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
        if (torch.is_grad_enabled() and (lepe.requires_grad or out.requires_grad)) or out.dtype != lepe.dtype:
            return self.out_proj(out.reshape(b, h, w, c) + lepe)
        # inference: out + lepe into the conv's output, reading out in its own layout (no copy)
        return self.out_proj(lepe.unflatten(-1, (self.num_heads, self.head_dims)).add_(out).flatten(-2))

    def queries_keys(self, x: torch.Tensor, pos: PositionTables) -> Tuple[torch.Tensor, torch.Tensor]:
        """The attention's q and k (B, n, H, W, d) for input tokens x (B, H, W, C): projected, k scaled by
        d^-0.5, both rotated by the RoPE tables ``pos``."""
        q = self.q_proj(x)
        k = self.k_proj(x)
        compiling = torch.compiler.is_compiling()
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
        if q.dtype in (torch.float32, torch.float64) and not compiling:
            if grad:
                # one complex product per channel pair each way, forward and backward, k's scale in its table
                return (self._rotated_pairs(q, pos.rotation(q.dtype)),
                        self._rotated_pairs(k, pos.rotation(k.dtype, self.scaling)))
            if q.is_contiguous() and k.is_contiguous():
                # inference: the same products in the tokens' own storage
                return (self._rotated_in_place(q, pos.rotation(q.dtype)),
                        self._rotated_in_place(k, pos.rotation(k.dtype, self.scaling)))
        sin, cos = pos.cast(q.dtype)
        k = k * self.scaling if grad or compiling else k.mul_(self.scaling)
        return self._rotated_heads(q, sin, cos), self._rotated_heads(k, sin, cos)

    def _rotated_pairs(self, t: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
        """Projected tokens t (B, H, W, C) as heads (B, n, H, W, d), each channel pair times the complex
        ``rotation`` (H, W, d / 2): a new tensor in t's layout, differentiable."""
        pairs = torch.view_as_complex(self._heads(t).unflatten(-1, (-1, 2)))
        return torch.view_as_real(pairs * rotation).flatten(-2)

    def _rotated_in_place(self, t: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
        """Projected tokens t (B, H, W, C), contiguous, rotated in place by the complex ``rotation`` (H, W, d / 2),
        as heads (B, n, H, W, d)."""
        pairs = torch.view_as_complex(t.view(*t.shape[:-1], self.num_heads, self.head_dims // 2, 2))
        pairs.mul_(rotation.unsqueeze(-2))
        return self._heads(t)

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
        """What the mask reads: the decay tables (Ca, Cb) (B, n, H, W) learned from x (one op, one kernel on GPUs:
        :meth:`PathEmbed.tables`), (log_decay,) (n,) for 'rmt', () for 'none'."""
        if self.path_embed is not None:
            return self.path_embed.tables(x, self.impl)
        return (pos.log_decay, ) if self.mask == 'rmt' else ()

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor,
                pos: PositionTables) -> torch.Tensor:
        """q, k, v (B, n, H, W, d) -> (B, n, H, W, d); decays from the normalized tokens x (B, H, W, C)."""
        return self.attention(q, k, v, *self._decays(x, pos))

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *decays: torch.Tensor) -> torch.Tensor:
        """This layer's op: q, k, v (B, n, H, W, d) -> (B, n, H, W, d), ``decays`` as :meth:`_decays` gives
        them. Every tensor it reads is an argument, so a FLOP counter can trace it as one node
        (:func:`mmppma.models.flops.count_flops`)."""
        return self._op(q, k, v, *decays)

    def log_decays(self, x: torch.Tensor, pos: PositionTables) -> Tuple[torch.Tensor, torch.Tensor]:
        """The mask's log-decays (la, lb) on x's token grid, (B, n, H, W) float32: learned from x, RMT's fixed
        per-head decay broadcast, or zeros (mask 'none')."""
        if self.path_embed is not None:
            return self.path_embed(x)
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

        * ``'mask'``: the path mask from the query to each key: L2D = exp(M) + exp(M^T) (a learned mask, forms
          'release' and 'paper'), exp(M) (form 'v2h'; mask 'rmt', whose Manhattan mask is symmetric), ones
          (mask 'none'); for
          criss-cross stages the 2D mask of the same decays (their attention reaches it in two steps);
        * ``'attention'``: the weights this layer's attention gives each key (it is linear in v: applied to
          one-hot values), exact for every ``attn_type``, ``mask`` and ``form``;
        * ``'unmasked'``: softmax(q k^T) over all keys, without a mask.
        """
        b, h, w, _ = x.shape
        for i, j in queries:
            if not (0 <= i < h and 0 <= j < w):
                raise ValueError(f'query ({i}, {j}) is outside the {h} x {w} token grid')
        index = [i * w + j for i, j in queries]
        q, k = self.queries_keys(x, pos)
        la, lb = self.log_decays(x, pos)
        paths = '2d' if self.mask in LEARNED_MASKS and self.form != 'v2h' else 'v2h'
        mask = polyline_mask(la, lb, form=paths, space='linear', queries=index)
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
