"""Criss-cross attention, Triton path: the line kernels (:mod:`mmppma.ops.line.triton_impl`) along rows and
columns, composed as the torch path composes its maps."""
from ..line.triton_impl import line_attention
from .torch_impl import compose_criss_cross


def criss_cross_attention_triton(q, k, v, ca, cb, scale: float, form: str, op: str = 'criss_cross_attention',
                                 traced=None):
    """Criss-cross attention of ``form`` (:func:`~mmppma.ops.criss_cross_attention`) on the line kernels.
    q, k: (B, heads, H, W, d); v: (B, heads, H, W, dv); ca (row), cb (column) decay tables: (B, heads, H, W);
    ``op`` names the public op in errors; ``traced`` as :func:`line_attention`'s. The kernels read q, k
    and v in the caller's layout."""

    def rows(x):
        return line_attention(q, k, x, ca, scale, False, op, traced)

    def cols(x):
        return line_attention(q, k, x, cb, scale, True, op, traced)

    return compose_criss_cross(rows, cols, v, form)
