"""PPMLA and PPMDA, torch path: ``((s1 s2^T) * L) v`` in O(N) without an N x N tensor: per token ``s2 (x) v``
(r x d_v), the mask applied to it by Algorithm 1's scans (:func:`~mmppma.ops.scan.torch_impl.matvec`), contracted
with s1."""
import functools

import torch

from ..scan.torch_impl import matvec, scan_torch
from .reference import decomposed, linear


def decomposed_scan(s1, s2, v, la, lb, form: str, chunk: int) -> torch.Tensor:
    """``((s1 s2^T) * L) v`` by the scans, s1, s2, v in one float dtype."""
    b, heads, h, w, r = s1.shape
    dv = v.shape[-1]
    kv = (s2.unsqueeze(-1) * v.unsqueeze(-2)).reshape(b, heads, h, w, r * dv)  # per-token s2 (x) v
    z = matvec(functools.partial(scan_torch, chunk=chunk), kv, la, lb, form).reshape(b, heads, h, w, r, dv)
    return (s1.unsqueeze(-2) @ z).squeeze(-2)


def ppma_decomposed_attention_plan(s1, s2, v, la, lb, form: str, chunk: int):
    """The torch path of :func:`~mmppma.ops.ppma_decomposed_attention` (:class:`~mmppma.ops.plan.Op`)."""
    return functools.partial(decomposed, functools.partial(decomposed_scan, form=form, chunk=chunk))


def ppma_linear_attention_plan(q, k, v, la, lb, *normalizer_and_options):
    """The torch path of :func:`~mmppma.ops.ppma_linear_attention`; arguments as the reference path's."""
    *_, form, feature_map, normalize, eps, chunk = normalizer_and_options
    return functools.partial(linear, functools.partial(decomposed_scan, form=form, chunk=chunk), feature_map,
                             normalize, eps)
