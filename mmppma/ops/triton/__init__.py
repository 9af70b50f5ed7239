"""Triton kernels (GPU; CPU under ``TRITON_INTERPRET=1``), each with its autograd wrapper beside it.

Importing this package imports triton; :mod:`mmppma.ops` does so only when ``impl`` resolves to
``'triton'``, so everything else works where triton is missing.
"""
import torch

from ..polyline_mask import decay_tables


def _check_form(form: str) -> tuple:
    if form == 'paper':
        raise NotImplementedError("impl='triton' implements the softmax-biased forms ('release', 'v2h', "
                                  "'h2v'); for form='paper' use impl='torch'")
    return form in ('release', 'v2h'), form in ('release', 'h2v')


def ppma_attention_triton(q, k, v, la, lb, scale: float = 1.0, form: str = 'release'):
    from .whole_attention import whole_attention_triton
    v2h, h2v = _check_form(form)
    ca, cb = decay_tables(la, lb)
    return whole_attention_triton(q, k, v, ca, cb, scale, v2h, h2v)


def manhattan_attention_triton(q, k, v, log_decay, scale: float = 1.0):
    """RMT's Manhattan decay is the V2H polyline mask with constant decays."""
    from .whole_attention import whole_attention_triton
    b, heads, h, w, _ = q.shape
    g = log_decay.float()
    g = (g if g.dim() == 2 else g.unsqueeze(0))[:, :, None, None].expand(b, heads, h, w)
    ca, cb = decay_tables(g, g)
    return whole_attention_triton(q, k, v, ca, cb, scale, True, False)


def criss_cross_attention_triton(q, k, v, la, lb, scale: float = 1.0, order: str = 'both'):
    from .line_attention import criss_cross_attention_triton as run
    ca, cb = decay_tables(la, lb)
    return run(q, k, v, ca, cb, scale, order)


def rmt_criss_cross_attention_triton(q, k, v, log_decay, scale: float = 1.0):
    b, heads, h, w, _ = q.shape
    g = log_decay.float()
    g = (g if g.dim() == 2 else g.unsqueeze(0))[:, :, None, None].expand(b, heads, h, w)
    return criss_cross_attention_triton(q, k, v, g, g, scale, 'row_col')
