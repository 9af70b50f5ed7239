"""Criss-cross attention, Triton path: the line kernels (:mod:`mmppma.ops.line.triton_impl`) along rows and
columns, composed as the torch path composes its maps. Eager calls under autograd run every pass as one autograd
node whose backward accumulates the passes' q, k and table gradients in the kernels (one buffer each)."""
import functools
from typing import Optional

import torch

from ..line import triton_impl as line
from ..line.triton_impl import line_attention
from ..masks import head_decay_tables, on_tables
from ..triton_support import launch as lp
from ..triton_support.calls import Caller, call_kernels
from .torch_impl import compose_criss_cross


def _pass_columns(form: str):
    """The two passes of a one-path form, in order: whether each runs along columns."""
    return (False, True) if form == 'h2v' else (True, False)


def _pass(q, k, x, c, scale, columns, cap, parts, other_table=None):
    """One line pass: its float32 output and log-normaliser (``parts``, ``other_table``: as
    :func:`~mmppma.ops.line.triton_impl.forward_launches` takes them)."""
    launches, out, lse = line.forward_launches(q, k, x, c, scale, columns, cap, parts=parts, other_table=other_table)
    lp.run(launches)
    return out, lse


def _forward(q, k, v, ca, cb, scale: float, form: str, backward: bool = True):
    """The output in v's dtype and, per pass, what its backward reads: its input x, its float32 output and lse;
    then the tables' parts (or None). Each pass's input is the previous output in v's dtype, as
    :func:`compose_criss_cross` composes them. Where a later pass or (``backward``) a pass's backward takes the
    tables in its products (:func:`~mmppma.ops.line.triton_impl.folds`), the first writes both tables' parts and
    every pass its lse's, for the passes after it and the backward."""
    cap, dtype = lp.capability(q.device), v.dtype
    order = (False, True, False) if form == 'release' else _pass_columns(form)
    parts = (line.table_parts_buffer(q) if line.folds(q, order[1:], cap) or backward and line.folds(q, order, cap, True)
             else None)

    def run(x, columns):
        first = not saved
        out, lse = _pass(q, k, x, cb if columns else ca, scale, columns, cap, parts,
                         (ca if columns else cb) if first and parts is not None else None)
        saved.extend((x, out, lse))
        return out.to(dtype)

    saved = []
    if form == 'release':
        dv = v.shape[-1]
        vu = torch.cat([v, run(v, False)], -1)  # [v, Aw v]
        both = run(vu, True)  # [Ah v, Ah Aw v]
        # the last row pass takes the first's log-normaliser (the same scores) and also stores (Aw Ah v + Ah Aw v) / 2
        launches, last, lse, out = line.forward_launches(q, k, both[..., :dv], ca, scale, False, cap, both[..., dv:],
                                                         lse=saved[2], parts=parts)
        lp.run(launches)
        saved.extend((both[..., :dv], last, lse))
    else:
        first, second = _pass_columns(form)
        out = run(run(v, first), second)
    return (out, *saved, parts)


def _infer(q, k, v, ca, cb, scale: float, form: str):
    return _forward(q, k, v, ca, cb, scale, form, False)[:1]


def _backward(dout, q, k, v, ca, cb, *saved_and_arguments):
    """dq, dk, dv in the inputs' dtypes and dCa, dCb (float32): the passes' backward launches in reverse, q's, k's
    and each table's gradient accumulated in one float32 buffer by the kernels."""
    *saved, parts, scale, form = saved_and_arguments
    cap, dtype = lp.capability(q.device), v.dtype
    grads = dict(dq=None, dk=None, rows=None, cols=None)

    def back(x, out, lse, columns, grad):  # a pass's input, output and lse (as saved)
        table = 'cols' if columns else 'rows'
        grad = grad.to(x.dtype)
        if grad.stride(-1) != 1:
            grad = grad.contiguous()
        launches, (dq, dk, dx, dc) = line.backward_launches(
            q, k, x, cb if columns else ca, out, lse, grad, scale, columns, cap, grads['dq'], grads['dk'],
            grads[table], parts)
        lp.run(launches)
        grads.update(dq=dq, dk=dk, **{table: dc})
        return dx

    if form == 'release' and not line.merges_row_passes(q, v.shape[-1], cap):
        dv = v.shape[-1]
        half = dout * 0.5
        d_both = torch.cat([back(*saved[6:9], False, half).to(dtype), half.to(dtype)], -1)
        d_vu = back(*saved[3:6], True, d_both)
        d_v = d_vu[..., :dv] + back(*saved[0:3], False, d_vu[..., dv:])
    elif form == 'release':
        # the row passes (the first and the last) share their probabilities P: the last's value gradient P^T dO
        # first, then the column pass's backward, then one row backward of both passes over their value channels
        # side by side (the score gradient's terms of both in one sum)
        dv = v.shape[-1]
        half = (dout * 0.5).to(dtype)
        if half.stride(-1) != 1:
            half = half.contiguous()
        x_last, out_last, lse = saved[6:9]
        launches, (_, _, d_last, _) = line.backward_launches(q, k, x_last, ca, None, lse, half, scale, False, cap,
                                                             parts=parts, values_only=True)
        lp.run(launches)
        d_vu = back(*saved[3:6], True, torch.cat([d_last.to(dtype), half], -1))
        d_rows = back(torch.cat([saved[0], x_last], -1), torch.cat([saved[1], out_last], -1), lse, False,
                      torch.cat([d_vu[..., dv:], half], -1))
        d_v = d_vu[..., :dv] + d_rows[..., :dv]
    else:
        first, second = _pass_columns(form)
        d_v = back(*saved[0:3], first, back(*saved[3:6], second, dout))
    # every form passes along rows and along columns: both tables have their gradient
    return grads['dq'].to(q.dtype), grads['dk'].to(k.dtype), d_v.to(v.dtype), grads['rows'], grads['cols']


#: the eager path under autograd (:class:`~mmppma.ops.triton_support.calls.KernelFunction`): every pass in one
#: node, its inputs, outputs and log-normalisers saved
CRISS_CROSS_KERNELS = (_forward, _backward, 5)


def criss_cross_attention_triton(q, k, v, ca, cb, scale: float, form: str, caller: Caller,
                                 traced: Optional[bool] = None):
    """Criss-cross attention of ``form`` (:func:`~mmppma.ops.criss_cross_attention`) on the line kernels.
    q, k: (B, heads, H, W, d); v: (B, heads, H, W, dv); ca (row), cb (column) decay tables: (B, heads, H, W);
    ``caller``: what errors name; ``traced`` as :func:`line_attention`'s. The kernels read q, k and v in the
    caller's layout."""
    if torch.compiler.is_compiling() if traced is None else traced:
        def rows(x):
            return line_attention(q, k, x, ca, scale, False, caller, traced)

        def cols(x):
            return line_attention(q, k, x, cb, scale, True, caller, traced)

        return compose_criss_cross(rows, cols, v, form)
    q, k, v = lp.kernel_layout(q, k, v)
    ca, cb = ca.float().contiguous(), cb.float().contiguous()
    return call_kernels(caller, None, CRISS_CROSS_KERNELS, _infer, False, q, k, v, ca, cb, float(scale), form)


def criss_cross_attention_plan(q, k, v, la, lb, scale: float, form: str, tables: bool, traced: Optional[bool]):
    """The Triton path of :func:`~mmppma.ops.criss_cross_attention` (:class:`~mmppma.ops.plan.Op`)."""
    return on_tables(functools.partial(criss_cross_attention_triton, scale=scale, form=form,
                                       caller=Caller.of('criss_cross_attention', q), traced=traced), tables)


def rmt_criss_cross_attention_plan(q, k, v, log_decay, scale: float, traced: Optional[bool]):
    """The Triton path of :func:`~mmppma.ops.rmt_criss_cross_attention`: the line kernels on per-head decay tables,
    rows first (form 'h2v')."""
    caller = Caller.of('rmt_criss_cross_attention', q)

    def rmt(q, k, v, log_decay):
        return criss_cross_attention_triton(q, k, v, *head_decay_tables(log_decay, q.shape[:-1]), scale, 'h2v',
                                            caller, traced)
    return rmt
