"""The one path encoding: a ``form`` names the path(s) a polyline mask takes, from the public ops down to the
Triton launches (the kernels compute V2H; an H2V path runs them on the transposed map, :func:`transposed`).

* ``'v2h'``: the mask M (along the query's row, then the key's column); ``'h2v'``: its transpose M^T;
* ``'release'`` (softmax attentions): the mean of the two one-path softmaxes, as the released checkpoints;
* ``'paper'`` (whole attention): softmax(S) * (exp(M) + exp(M^T)), paper Eq. 33;
* ``'2d'`` (masks, mask-vector products, linear attention): L2D = exp(M) + exp(M^T).

Criss-cross attention takes the softmax forms: ``'v2h'`` composes Aw(Ah v) (columns first, the V2H path),
``'h2v'`` Ah(Aw v) (rows first, RMT's), ``'release'`` the mean of both.
"""
from typing import Tuple

WHOLE_FORMS = ('release', 'paper', 'v2h', 'h2v')
CRISS_CROSS_FORMS = ('release', 'v2h', 'h2v')
MASK_FORMS = ('v2h', 'h2v', '2d')


def paths(form: str) -> Tuple[str, ...]:
    """The one-path forms that ``form`` sums ('release' and '2d' both, weighted equally); a one-path form itself."""
    return ('v2h', 'h2v') if form in ('release', '2d', 'paper') else (form, )


def transposed(form: str) -> str:
    """The form of the same attention on the transposed image (rows and columns swapped): 'v2h' <-> 'h2v'."""
    return {'v2h': 'h2v', 'h2v': 'v2h'}.get(form, form)
