"""PPMLA and PPMDA, torch path: ``((s1 s2^T) * L) v`` in O(N) without an N x N tensor. Small maps take the scan form:
per token ``s2 (x) v`` (r x d_v), the mask applied to it by Algorithm 1's scans
(:func:`~mmppma.ops.scan.torch_impl.matvec`), contracted with s1. Maps whose field of r x d_v states would be large
take the chunked form (:mod:`.chunked`); :func:`uses_chunked` is the crossover."""
import functools

import torch

from ..export import exporting
from ..scan.torch_impl import matvec, scan_torch
from .chunked import chunk_rows, chunked, chunked_counts, field_bytes
from .reference import decomposed, linear

#: the scan form's field of r x d_v states (float32 bytes per image and head) above which the chunked form runs: on
#: CPU at r = d_v = 32 the two take about the same time at 96 x 96 tokens (36 MiB), the scan form 5x less at 64 x 64
CHUNKED_FIELD_BYTES = 32 * 2 ** 20


def uses_chunked(h: int, w: int, r: int, dv: int, form: str) -> bool:
    """Whether the torch path runs the chunked form on an H x W map: once the scan form's N x r x d_v field passes
    :data:`CHUNKED_FIELD_BYTES` per image and head and the chunked form's largest intermediate is smaller than that
    field. Below, the scan form's few batched products run faster than the loop over chunks. Under autograd the
    chunked form saves its inputs only, the scan form its field and more. Not while a model is exported or compiled
    (their graphs keep the scan form)."""
    if exporting() or torch.compiler.is_compiling():
        return False
    field = field_bytes(h, w, r, dv)
    if field <= CHUNKED_FIELD_BYTES:
        return False
    return chunked_counts(h, w, r, dv, chunk_rows(h, w, r, dv, form), form).largest < field


def decomposed_scan(s1, s2, v, la, lb, form: str, chunk: int) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` by the scans, s1, s2, v in one float dtype."""
    b, heads, h, w, r = s1.shape
    dv = v.shape[-1]
    kv = (s2.unsqueeze(-1) * v.unsqueeze(-2)).reshape(b, heads, h, w, r * dv)  # per-token s2 (x) v
    z = matvec(functools.partial(scan_torch, chunk=chunk), kv, la, lb, form).reshape(b, heads, h, w, r, dv)
    return (s1.unsqueeze(-2) @ z).squeeze(-2)


def decomposed_torch(s1, s2, v, la, lb, form: str, chunk: int) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` in the form :func:`uses_chunked` picks for these shapes (the normalizer's product, of
    one value channel, may take the scan form where the output's takes the chunked one)."""
    if uses_chunked(*s1.shape[-3:], v.shape[-1], form):
        return chunked(s1, s2, v, la, lb, form)
    return decomposed_scan(s1, s2, v, la, lb, form, chunk)


def ppma_decomposed_attention_plan(s1, s2, v, la, lb, form: str, chunk: int):
    """The torch path of :func:`~mmppma.ops.ppma_decomposed_attention` (:class:`~mmppma.ops.plan.Op`)."""
    return functools.partial(decomposed, functools.partial(decomposed_torch, form=form, chunk=chunk))


def ppma_linear_attention_plan(q, k, v, la, lb, *normalizer_and_options):
    """The torch path of :func:`~mmppma.ops.ppma_linear_attention`; arguments as the reference path's."""
    *_, form, feature_map, normalize, eps, chunk = normalizer_and_options
    return functools.partial(linear, functools.partial(decomposed_torch, form=form, chunk=chunk), feature_map,
                             normalize, eps)
