"""Argument checks shared by the ops: shapes are validated up front so that a mistake surfaces as a
``ValueError`` naming the expected layout instead of a broadcasting error deep inside a matmul."""
from typing import Optional, Sequence

import torch

from mmppma.utils.checks import check_choice

from .dispatch import resolve_impl

QKV_LAYOUT = ('q, k: (B, heads, H, W, d); v: (B, heads, H, W, d_v); '
              'la (horizontal), lb (vertical) log-decays: (B, heads, H, W)')


def _shape(t: torch.Tensor) -> str:
    return '(' + ', '.join(str(s) for s in t.shape) + ')'


def check_decays(la: torch.Tensor, lb: torch.Tensor, what: str = 'la, lb') -> None:
    if la.dim() != 4 or la.shape != lb.shape:
        raise ValueError(f'{what}: expected two log-decay tensors of the same shape (B, heads, H, W); '
                         f'got la {_shape(la)}, lb {_shape(lb)}')
    if la.is_complex() or not la.is_floating_point() or not lb.is_floating_point():
        raise ValueError(f'{what}: log-decays must be real floating point tensors; got {la.dtype}, {lb.dtype}')


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: Optional[torch.Tensor] = None,
              lb: Optional[torch.Tensor] = None) -> None:
    """Check q, k, v (and, when given, the log-decays la, lb) against :data:`QKV_LAYOUT`.

    The message is formatted only on failure: formatting shapes (``str`` of a symbolic size) is what
    ``torch.compile`` cannot trace, so a check that formats eagerly breaks the graph of every op."""
    if (q.dim() != 5 or k.shape != q.shape or v.dim() != 5 or v.shape[:-1] != q.shape[:-1]
            or (la is not None and (la.shape != q.shape[:-1] or lb.shape != q.shape[:-1]))):
        got = f'got q {_shape(q)}, k {_shape(k)}, v {_shape(v)}'
        if la is not None:
            got += f', la {_shape(la)}, lb {_shape(lb)}'
        raise ValueError(f'expected {QKV_LAYOUT}; {got}')
    if la is not None:
        check_decays(la, lb)
    for name, t in (('q', q), ('k', k), ('v', v)):
        if not t.is_floating_point():
            raise ValueError(f'{name} must be a floating point tensor (float16, bfloat16, float32 or float64); '
                             f'got {t.dtype}')


def check_log_decay(log_decay: torch.Tensor, q: torch.Tensor) -> None:
    """RMT's fixed decay: ``log_decay`` (heads,) or (B|1, heads), real floating point, for q (B, heads, H, W, d)."""
    batch, heads = q.shape[:2]
    if (not isinstance(log_decay, torch.Tensor) or log_decay.dim() not in (1, 2) or log_decay.shape[-1] != heads
            or (log_decay.dim() == 2 and log_decay.shape[0] not in (1, batch))):
        got = _shape(log_decay) if isinstance(log_decay, torch.Tensor) else type(log_decay).__name__
        raise ValueError(f'log_decay: expected (heads,) or (B, heads) with B={batch}, heads={heads} (one fixed '
                         f'log-decay per head); got {got}')
    if log_decay.is_complex() or not log_decay.is_floating_point():
        raise ValueError(f'log_decay must be a real floating point tensor; got {log_decay.dtype}')


def table_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Decay tables (cumsums) are float32 at least, float64 when any input is float64 (tests)."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def checked_impl(op: str, forms: Sequence[str], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, la: torch.Tensor,
                 lb: torch.Tensor, form: str, impl: str) -> str:
    """The implementation ``impl`` resolves to for softmax attention ``op`` of (q, k, v, la, lb) in ``form`` (one of
    ``forms``), after the arguments' checks."""
    check_choice('form', form, forms)
    check_qkv(q, k, v, la, lb)
    return resolve_impl(impl, op, (q, k, v), form)
