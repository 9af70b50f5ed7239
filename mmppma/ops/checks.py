"""The ops' argument checks: shapes are validated up front so that a mistake surfaces as a ``ValueError`` naming
the expected layout instead of a broadcasting error deep inside a matmul. Each public op's check (the ``check`` of
its :class:`~mmppma.ops.plan.Op`) takes its tensors and options as the op's paths do, and returns the form that
:func:`~mmppma.ops.plan.resolve_impl` looks up (None for an op without forms)."""
import functools
from typing import Optional, Sequence

import torch

from mmppma.utils.checks import check_choice

from .forms import CRISS_CROSS_FORMS, MASK_FORMS, WHOLE_FORMS

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


def check_attention(forms: Sequence[str], q, k, v, la, lb, scale: float, form: str, tables: bool) -> str:
    """The arguments of a softmax attention of (q, k, v, la, lb) in ``form``, one of ``forms``."""
    check_choice('form', form, forms)
    check_qkv(q, k, v, la, lb)
    return form


#: :func:`~mmppma.ops.ppma_attention`'s and :func:`~mmppma.ops.criss_cross_attention`'s checks
check_whole = functools.partial(check_attention, WHOLE_FORMS)
check_criss_cross = functools.partial(check_attention, CRISS_CROSS_FORMS)


def check_fixed_decay(q, k, v, log_decay, scale: float) -> None:
    """The arguments of RMT's attentions (:func:`~mmppma.ops.manhattan_attention`,
    :func:`~mmppma.ops.rmt_criss_cross_attention`)."""
    check_qkv(q, k, v)
    check_log_decay(log_decay, q)


def check_decay_tables(x, weight, dt_bias, a_log) -> None:
    """:func:`~mmppma.ops.path_decay_tables`' arguments."""
    if x.dim() != 4 or weight.dim() != 2 or dt_bias.dim() != 1 or a_log.shape != dt_bias.shape:
        raise ValueError(f'path_decay_tables takes x (B, H, W, heads * d), weight (directions, d), dt_bias and a_log '
                         f'(heads,); got {tuple(x.shape)}, {tuple(weight.shape)}, {tuple(dt_bias.shape)}, '
                         f'{tuple(a_log.shape)}')
    check_choice('the weight\'s directions', weight.shape[0], (1, 2))
    if x.shape[-1] != dt_bias.shape[0] * weight.shape[1]:
        raise ValueError(f'path_decay_tables: x has {x.shape[-1]} channels, not heads * d = {dt_bias.shape[0]} * '
                         f'{weight.shape[1]}')
    if not x.is_floating_point():
        raise TypeError(f'path_decay_tables takes floating-point tokens, got {x.dtype}')


def check_scan(x, log_decay, chunk: int) -> None:
    """:func:`~mmppma.ops.decay_scan_1d`'s arguments."""
    if x.dim() < 2 or log_decay.shape != x.shape[:-1]:
        raise ValueError(f'decay_scan_1d: expected x (..., L, D) and log_decay (..., L); got x {tuple(x.shape)}, '
                         f'log_decay {tuple(log_decay.shape)}')
    if not log_decay.is_floating_point() or log_decay.is_complex():
        raise ValueError(f'decay_scan_1d: log_decay must be a real floating point tensor; got {log_decay.dtype}')


def check_matvec(x, la, lb, form: str, chunk: int) -> str:
    """:func:`~mmppma.ops.polyline_mask_matvec`'s arguments."""
    check_choice('form', form, MASK_FORMS)
    check_decays(la, lb)
    if x.dim() != 5 or x.shape[:-1] != la.shape:
        raise ValueError(f'x: expected (B, heads, H, W, D) matching la, lb (B, heads, H, W) = '
                         f'{tuple(la.shape)}; got x {tuple(x.shape)}')
    return form


def check_matvec_3d(x, la, lb, lc, chunk: int) -> None:
    """:func:`~mmppma.ops.polyline_mask_matvec_3d`'s arguments."""
    if not (la.dim() == 5 and la.shape == lb.shape == lc.shape and x.dim() == 6 and x.shape[:-1] == la.shape):
        raise ValueError('expected x (B, heads, D, H, W, C) and la, lb, lc (B, heads, D, H, W); got '
                         f'x {tuple(x.shape)}, la {tuple(la.shape)}, lb {tuple(lb.shape)}, lc {tuple(lc.shape)}')
    for name, t in (('la', la), ('lb', lb), ('lc', lc)):
        if not t.is_floating_point() or t.is_complex():
            raise ValueError(f'{name}: log-decays must be real floating point tensors; got {t.dtype}')


def check_decomposed(s1, s2, v, la, lb, form: str, chunk: int) -> str:
    """:func:`~mmppma.ops.ppma_decomposed_attention`'s arguments (and PPMLA's q, k, v, la, lb)."""
    check_choice('form', form, MASK_FORMS)
    if not (s1.dim() == 5 and s2.shape == s1.shape and v.dim() == 5 and v.shape[:-1] == s1.shape[:-1]
            and la.shape == s1.shape[:-1]):
        raise ValueError('expected s1, s2 (or q, k): (B, heads, H, W, r); v: (B, heads, H, W, d_v); '
                         'la, lb: (B, heads, H, W); got '
                         f'{tuple(s1.shape)}, {tuple(s2.shape)}, {tuple(v.shape)}, {tuple(la.shape)}, '
                         f'{tuple(lb.shape)}')
    check_decays(la, lb)
    return form


def check_linear(q, k, v, la, lb, *normalizer_and_options) -> str:
    """:func:`~mmppma.ops.ppma_linear_attention`'s arguments: q, k, v, la, lb, the normalizer's q', k' (when given),
    then form, feature_map, normalize, eps, chunk."""
    *normalizer, form, _, normalize, _, chunk = normalizer_and_options
    if normalizer and not normalize:
        raise ValueError('normalizer=(q, k) is only used with normalize=True; pass normalize=True or drop it')
    check_decomposed(q, k, v, la, lb, form, chunk)
    if normalizer and (normalizer[0].shape != q.shape or normalizer[1].shape != k.shape):
        raise ValueError(f'normalizer: expected tensors shaped like q {tuple(q.shape)} and k {tuple(k.shape)}; '
                         f'got {tuple(normalizer[0].shape)} and {tuple(normalizer[1].shape)}')
    return form
