"""Criss-cross attention, Triton path: the line kernels (:mod:`mmppma.ops.line.triton_impl`) along rows and
columns, composed as the torch path composes its maps."""
from ..line.triton_impl import line_attention
from .torch_impl import compose_criss_cross


def criss_cross_attention_triton(q, k, v, ca, cb, scale: float, form: str):
    """Criss-cross attention of ``form`` (:func:`~mmppma.ops.criss_cross_attention`) on the line kernels.
    q, k: (B, heads, H, W, d); v: (B, heads, H, W, dv); ca (row), cb (column) decay tables: (B, heads, H, W)."""
    b, heads, hh, ww, d = q.shape
    dv = v.shape[-1]
    q3, k3 = q.reshape(b * heads, hh, ww, d), k.reshape(b * heads, hh, ww, d)
    v3 = v.reshape(b * heads, hh, ww, dv)
    ca3, cb3 = ca.reshape(b * heads, hh, ww), cb.reshape(b * heads, hh, ww)

    def rows(x):
        return line_attention(q3, k3, x, ca3, scale, False)

    def cols(x):
        return line_attention(q3, k3, x, cb3, scale, True)

    return compose_criss_cross(rows, cols, v3, form).reshape(b, heads, hh, ww, dv)
