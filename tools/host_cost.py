#!/usr/bin/env python
"""The host's work per step, counted on CPU: launches, host syncs and Python calls of PPMA-T, RMT-T and PPMLA-T
on the simulated GPU, split by region, and each attention op's host time against SDPA.

    python tools/host_cost.py [--models PPMA-T RMT-T PPMLA-T] [--shape 224 224] [--batch 2] [--cap 90]
                              [--modes infer-fp32 infer-bf16 train-fp32 train-bf16] [--release-dir DIR]
                              [--repeats 300] [--no-ops] [--quick] [--check] [--check-times] [--json FILE]

The device is the simulated one (``MMPPMA_SIMULATE_CUDA``, default sm_90, ``TRITON_INTERPRET=1``, set by the tool
before triton is imported) with ``impl='auto'``: the CUDA host path and the real launch table run, and every
Triton launch is counted and not run (``Launch.__call__`` replaced). On a GPU each launch and each torch kernel
is one kernel launch, so their sum is what a step costs the host in launches:

* **torch kernels**: every aten op below autograd (a ``TorchDispatchMode``; backward ops included), except views,
  metadata ops and allocations (``empty``), which launch nothing;
* **triton**: the ops' kernel launches;
* **syncs**: what waits for the device: ``aten._local_scalar_dense`` (``.item()``), ``Tensor.tolist``,
  ``.cpu()`` / ``.numpy()`` of a tensor on the (simulated) GPU, ``torch.cuda.synchronize``;
* **Python calls**: ``sys.setprofile`` 'call' events of the step (Triton's own launcher is not run, so its
  Python is not counted), in a pass of its own without the counters above.

Regions: ``attention`` (the attention op a layer calls), ``decays`` (the learned log-decays, ``PathEmbed``),
``qk_rope`` (q and k projections with RoPE, and the RoPE tables), ``rest``. The backward's ops count towards
the region whose forward made their autograd node.

A step is ``infer`` (``eval()`` under ``torch.inference_mode``) or ``train`` (forward, the sum of the outputs,
backward; no optimizer), in float32 or under ``torch.autocast`` bfloat16; each is run once before it is counted
(the preflight, lazy tables). The counts do not depend on the input size.

``--release-dir DIR`` counts the release's own models (``zhongchenzhao/PPMA``'s ``classification/models/
{PPMA,RMT}.py`` placed in DIR; plain PyTorch, not part of this project; they import timm and einops) through
their ``forward_features``. ``--check`` exits with 1 when a bound of :data:`BOUNDS` fails (counts: the same on
every machine); ``--check-times`` also when a bound of :data:`TIME_BOUNDS` fails (host times against SDPA's, a
benchmark: run it on a quiet machine). :data:`TARGETS` are reported. ``--quick`` is the test tier's form: PPMA-T's
inference and training steps in float32 at batch 1, 50 repeats of the op timings.
"""
import argparse
import bisect
import contextlib
import json
import os
import os.path as osp
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

SIMULATE = 'MMPPMA_SIMULATE_CUDA'
MODELS = ('PPMA-T', 'RMT-T', 'PPMLA-T')
MODES = ('infer-fp32', 'infer-bf16', 'train-fp32', 'train-bf16')
REGIONS = ('attention', 'decays', 'qk_rope', 'rest')
#: the bounds ``--check`` enforces (the test tier runs it): PPMA-T's launches per inference and training step and
#: its Python calls per inference step
BOUNDS = dict(launches={'infer-fp32': 345, 'train-fp32': 1505}, python_calls=3300)
#: the bounds ``--check-times`` adds: whole attention's host time against SDPA's in the same run
TIME_BOUNDS = dict(host_forward=6.0, host_forward_backward=5.0)
#: the target reported beside them, not yet met (docs/host_cost.md): PPMA-T's launches against RMT-T's in the same
#: run
TARGETS = dict(against_rmt=1.1)
#: aten ops that launch nothing: allocations and metadata (views are told by their schema)
NO_KERNEL = {'_unsafe_view', 'empty', 'empty_strided', 'empty_like', 'new_empty', 'new_empty_strided', 'lift_fresh',
             'detach', 'is_same_size', 'sym_size', 'sym_stride', 'sym_numel', 'sym_storage_offset', 'is_nonzero_',
             'set_', 'resize_', 'record_stream', '_has_compatible_shallow_copy_type'}
SYNC_OPS = {'_local_scalar_dense', 'is_nonzero', 'equal'}


def _setup_device(cap: int) -> None:
    os.environ.setdefault(SIMULATE, str(cap))
    os.environ['TRITON_INTERPRET'] = '1'


class Counts:
    """What one step launched and synced, per region."""

    def __init__(self) -> None:
        self.torch = dict.fromkeys(REGIONS, 0)
        self.triton = dict.fromkeys(REGIONS, 0)
        self.syncs = 0
        self.python_calls = 0
        self.ops: Dict[str, int] = {}

    @property
    def launches(self) -> int:
        return sum(self.torch.values()) + sum(self.triton.values())

    def as_dict(self) -> dict:
        return dict(launches=self.launches, torch=sum(self.torch.values()), triton=sum(self.triton.values()),
                    syncs=self.syncs, python_calls=self.python_calls,
                    regions={r: self.torch[r] + self.triton[r] for r in REGIONS})


class Regions:
    """The region the host is in: a stack in the forward; in the backward, the region whose forward made the
    running autograd node (autograd's sequence numbers, recorded per region)."""

    def __init__(self) -> None:
        import torch
        self._torch = torch
        self.stack: List[str] = []
        self.starts: List[int] = []
        self.names: List[str] = []

    def enter(self, name: str) -> None:
        if not self.stack:
            self.starts.append(self._torch._C._autograd._get_sequence_nr())
            self.names.append(name)
        self.stack.append(name)

    def exit(self) -> None:
        self.stack.pop()
        if not self.stack:
            self.starts.append(self._torch._C._autograd._get_sequence_nr())
            self.names.append('rest')

    def current(self) -> str:
        if self.stack:
            return self.stack[-1]
        node = self._torch._C._current_autograd_node()
        if node is None or not self.starts:
            return 'rest'
        i = bisect.bisect_right(self.starts, node._sequence_nr()) - 1
        return self.names[i] if i >= 0 else 'rest'


def _region_targets() -> List[Tuple[object, str, str]]:
    """(owner, attribute, region) of the callables whose calls make up a region."""
    from mmppma.models.layers import attention, mlla, path_embed, rope
    return [(attention.PolylinePathAttention, 'attention', 'attention'),
            (mlla.MLLAAttention, '_linear_attention', 'attention'),
            (mlla.MLLAAttention, '_masked_linear_attention', 'attention'),
            (path_embed.PathEmbed, 'forward', 'decays'),
            (path_embed.PathEmbed, 'tables', 'decays'),
            (attention.PolylinePathAttention, 'queries_keys', 'qk_rope'),
            (mlla, 'apply_rope', 'qk_rope'),
            (mlla, 'mlla_rope_tables', 'qk_rope'),
            (rope.RasterRoPE2D, 'forward', 'qk_rope')]


@contextlib.contextmanager
def _patched(targets, wrap: Callable) -> None:
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in targets]
    try:
        for (owner, name, region), (_, _, fn) in zip(targets, saved):
            setattr(owner, name, wrap(fn, region))
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


@contextlib.contextmanager
def stubbed_launches(on_launch: Callable[[], None]):
    """Triton launches counted by ``on_launch`` and not run."""
    from mmppma.ops.triton_support import launch as lp
    saved = lp.Launch.__call__
    lp.Launch.__call__ = lambda self: on_launch()
    try:
        yield
    finally:
        lp.Launch.__call__ = saved


def _count_step(step: Callable[[], None]) -> Counts:
    """Launches, torch kernels and syncs of one call of ``step``, per region."""
    from torch._library.custom_ops import OPDEFS
    from torch.utils._python_dispatch import TorchDispatchMode
    counts, regions = Counts(), Regions()

    class Kernels(TorchDispatchMode):

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name.split('::')[-1]
            if _composite(func):  # inference mode dispatches composite ops whole: count what they are made of
                with self:
                    out = func.decompose(*args, **(kwargs or {}))
                if out is not NotImplemented:
                    return out
            if func.namespace == 'mmppma':  # a library op: the aten ops of its implementation are counted
                with self:
                    return OPDEFS[func._schema.name]._init_fn(*args, **(kwargs or {}))
            if name in SYNC_OPS:
                counts.syncs += 1
            elif name not in NO_KERNEL and not _is_view(func):
                region = regions.current()
                counts.torch[region] += 1
                counts.ops[name] = counts.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    def launched() -> None:
        counts.triton[regions.current()] += 1

    def wrap(fn, region):
        def in_region(*args, **kwargs):
            regions.enter(region)
            try:
                return fn(*args, **kwargs)
            finally:
                regions.exit()
        return in_region

    def synced(*args, **kwargs):
        counts.syncs += 1

    with _patched(_region_targets(), wrap), stubbed_launches(launched), _host_syncs(synced), Kernels():
        step()
    return counts


def _is_view(func) -> bool:
    """A view, or an op that returns no tensor (``promote_types``): no kernel."""
    returns = func._schema.returns
    return (any(r.alias_info is not None and not r.alias_info.is_write for r in returns)
            or not any('Tensor' in str(r.type) for r in returns))


def _composite(func) -> bool:
    import torch
    # prim ops (``prim::device`` under a FakeTensorMode) have no dispatcher entry
    return func.namespace != 'prim' and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                                                       'CompositeImplicitAutograd')


@contextlib.contextmanager
def _host_syncs(on_sync: Callable):
    """``Tensor.tolist`` / ``.cpu()`` / ``.numpy()`` of a tensor on the (simulated) GPU and
    ``torch.cuda.synchronize`` reported to ``on_sync`` (then run)."""
    import torch

    from mmppma.ops.devices import on_gpu
    saved = {name: getattr(torch.Tensor, name) for name in ('tolist', 'cpu', 'numpy')}
    sync = torch.cuda.synchronize

    def counted(name):
        def method(self, *args, **kwargs):
            if on_gpu(self):
                on_sync()
            return saved[name](self, *args, **kwargs)
        return method

    try:
        for name in saved:
            setattr(torch.Tensor, name, counted(name))
        torch.cuda.synchronize = lambda *a, **k: on_sync()
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        torch.cuda.synchronize = sync


def _python_calls(step: Callable[[], None]) -> int:
    """'call' events of one call of ``step`` (launches stubbed)."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == 'call':
            calls += 1

    with stubbed_launches(lambda: None):
        sys.setprofile(profile)
        try:
            step()
        finally:
            sys.setprofile(None)
    return calls - 1  # step itself


def release_models() -> Dict[str, Tuple[str, str]]:
    """'release PPMA-T' -> (the release's module, the factory of its tiny classifier), for every family variant with
    a release model (``Variant.release_model``: PPMA, RMT)."""
    from mmppma.models.backbones.family import variants
    return {f'release {v.name}-T': (v.name, f'{v.release_model}T') for v in variants() if v.release_model}


def build(name: str, release_dir: Optional[str] = None):
    """The model ``name`` (``<variant>-<size>`` of :data:`MODELS`, or a key of :func:`release_models`) and the call
    that runs it on a batch."""
    import importlib

    from mmppma.models.backbones.family import variant_of
    release = release_models()
    if name in release:
        sys.path.insert(0, osp.abspath(release_dir))
        module, factory = release[name]
        model = getattr(importlib.import_module(module), factory)(None)
        return model, model.forward_features
    variant, size = name.rsplit('-', 1)
    model = variant_of(variant).build(size.lower(), impl='auto')
    return model, model


def make_step(model, forward, mode: str, x) -> Callable[[], None]:
    import torch
    kind, precision = mode.split('-')
    autocast = (torch.autocast('cpu', dtype=torch.bfloat16) if precision == 'bf16' else contextlib.nullcontext())

    def outputs():
        with autocast:
            out = forward(x)
        return out if isinstance(out, (tuple, list)) else [out]

    if kind == 'infer':
        model.eval()

        def step():
            with torch.inference_mode():
                outputs()
    else:
        model.train()

        def step():
            sum(o.float().sum() for o in outputs()).backward()
    return step


def count_model(name: str, modes, shape, batch: int, release_dir=None) -> Dict[str, dict]:
    import torch
    torch.manual_seed(0)
    model, forward = build(name, release_dir)
    x = torch.randn(batch, 3, *shape)
    result = {}
    for mode in modes:
        step = make_step(model, forward, mode, x)
        with stubbed_launches(lambda: None):
            step()  # one-off work: the preflight, lazy tables
        counts = _count_step(step)
        counts.python_calls = _python_calls(step)
        result[mode] = dict(counts.as_dict(), ops=counts.ops)
    return result


# ---------------------------------------------------------------------------------------------------------------
# host time per op

def op_calls(shape=(2, 2, 4, 4, 16)) -> Dict[str, Tuple[Callable, tuple]]:
    """Each attention op with a kernel, and SDPA, at ``shape`` (B, heads, H, W, d): (op, inputs)."""
    import torch
    import torch.nn.functional as F

    from mmppma import ops
    b, heads, h, w, d = shape
    q, k, v = (torch.randn(shape) for _ in range(3))
    la, lb = (-torch.rand(b, heads, h, w) for _ in range(2))
    decay = -torch.rand(heads)
    flat = [t.flatten(2, 3) for t in (q, k, v)]
    return {
        'SDPA': (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), tuple(flat)),
        'whole (ppma_attention)': (lambda q, k, v, la, lb: ops.ppma_attention(q, k, v, la, lb, impl='auto'),
                                   (q, k, v, la, lb)),
        'criss-cross': (lambda q, k, v, la, lb: ops.criss_cross_attention(q, k, v, la, lb, impl='auto'),
                        (q, k, v, la, lb)),
        'Manhattan': (lambda q, k, v, decay: ops.manhattan_attention(q, k, v, decay, impl='auto'), (q, k, v, decay)),
    }


def host_time(fn: Callable, inputs: tuple, backward: bool, repeats: int) -> float:
    """Least thread CPU time of one call (forward, or forward and backward) over ``repeats`` calls, in microseconds,
    launches stubbed: the least is the call's own cost, whatever else the machine ran meanwhile."""
    import torch
    tensors = [t.detach().requires_grad_(backward) for t in inputs]

    def once():
        out = fn(*tensors)
        if backward:
            out.backward(torch.ones_like(out))

    times = []
    with stubbed_launches(lambda: None):
        for _ in range(10):
            once()
        for _ in range(repeats):
            start = time.thread_time_ns()
            once()
            times.append(time.thread_time_ns() - start)
    return min(times) / 1e3


def op_times(repeats: int) -> Dict[str, dict]:
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: dict(forward=host_time(fn, inputs, False, repeats),
                           forward_backward=host_time(fn, inputs, True, repeats))
                for name, (fn, inputs) in op_calls().items()}
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------------------
# report

def step_table(results: Dict[str, Dict[str, dict]], modes) -> List[str]:
    names = list(results)
    lines = ['| per step | ' + ' | '.join(names) + ' |', '|---|' + '---|' * len(names)]
    for mode in modes:
        lines.append(f'| launches, {mode} (torch + triton) | ' + ' | '.join(
            f"{r[mode]['launches']} ({r[mode]['torch']} + {r[mode]['triton']})" for r in results.values()) + ' |')
    for mode in modes:
        lines.append(f'| syncs, {mode} | ' + ' | '.join(str(r[mode]['syncs']) for r in results.values()) + ' |')
    for mode in modes:
        lines.append(f'| Python calls, {mode} | ' + ' | '.join(str(r[mode]['python_calls'])
                                                              for r in results.values()) + ' |')
    return lines


def region_table(results: Dict[str, Dict[str, dict]], modes) -> List[str]:
    lines = ['| model, step | ' + ' | '.join(REGIONS) + ' |', '|---|' + '---|' * len(REGIONS)]
    for name, r in results.items():
        for mode in modes:
            lines.append(f'| {name}, {mode} | ' + ' | '.join(str(r[mode]['regions'][g]) for g in REGIONS) + ' |')
    return lines


def op_table(times: Dict[str, dict]) -> List[str]:
    base = times['SDPA']
    lines = ['| op | forward (us) | x SDPA | forward+backward (us) | x SDPA |', '|---|---|---|---|---|']
    for name, t in times.items():
        lines.append(f"| {name} | {t['forward']:.1f} | {t['forward'] / base['forward']:.1f}x | "
                     f"{t['forward_backward']:.1f} | {t['forward_backward'] / base['forward_backward']:.1f}x |")
    return lines


def check(results: Dict[str, Dict[str, dict]], times: Optional[Dict[str, dict]], bounds: dict) -> List[str]:
    """The bounds of ``bounds`` (:data:`BOUNDS`, :data:`TIME_BOUNDS` or :data:`TARGETS`) that fail."""
    failed = []
    ppma, rmt = results.get('PPMA-T'), results.get('RMT-T')
    if ppma:
        for mode, bound in bounds.get('launches', {}).items():
            if mode in ppma and ppma[mode]['launches'] > bound:
                failed.append(f"PPMA-T {mode}: {ppma[mode]['launches']} launches > {bound}")
        if 'python_calls' in bounds and 'infer-fp32' in ppma and \
                ppma['infer-fp32']['python_calls'] > bounds['python_calls']:
            failed.append(f"PPMA-T infer-fp32: {ppma['infer-fp32']['python_calls']} Python calls > "
                          f"{bounds['python_calls']}")
        for mode in ppma:
            if ('against_rmt' in bounds and rmt and mode in rmt
                    and ppma[mode]['launches'] > bounds['against_rmt'] * rmt[mode]['launches']):
                failed.append(f"PPMA-T {mode}: {ppma[mode]['launches']} launches > {bounds['against_rmt']} x "
                              f"RMT-T's {rmt[mode]['launches']}")
    if times:
        whole, sdpa = times['whole (ppma_attention)'], times['SDPA']
        for key, bound in (('forward', 'host_forward'), ('forward_backward', 'host_forward_backward')):
            ratio = whole[key] / sdpa[key]
            if bound in bounds and ratio > bounds[bound]:
                failed.append(f'whole attention {key}: host time {ratio:.1f}x SDPA > {bounds[bound]}x')
    return failed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', default=None, choices=MODELS, help='default: all (--quick: PPMA-T)')
    parser.add_argument('--modes', nargs='+', default=None, choices=MODES,
                        help='default: all (--quick: infer-fp32 train-fp32)')
    parser.add_argument('--shape', nargs=2, type=int, default=None, metavar=('H', 'W'),
                        help='input size (default 224 224; --quick: 64 64)')
    parser.add_argument('--batch', type=int, default=None, help='default 2 (--quick: 1)')
    parser.add_argument('--cap', type=int, default=90, help='simulated compute capability (default 90)')
    parser.add_argument('--release-dir', help="folder with the release's PPMA.py and RMT.py (counts them too)")
    parser.add_argument('--repeats', type=int, default=None, help='op timing repeats (default 300; --quick: 50)')
    parser.add_argument('--no-ops', action='store_true', help='skip the op host times')
    parser.add_argument('--quick', action='store_true', help="the test tier's form (small input, few repeats)")
    parser.add_argument('--check', action='store_true', help='exit 1 when a bound of BOUNDS fails')
    parser.add_argument('--check-times', action='store_true',
                        help='exit 1 when a bound of BOUNDS or TIME_BOUNDS fails (on a quiet machine)')
    parser.add_argument('--json', help='also write the results to this file')
    args = parser.parse_args(argv)
    if args.check_times and args.no_ops:
        parser.error('--check-times needs the op host times: drop --no-ops')
    _setup_device(args.cap)
    shape = tuple(args.shape or (224, 224))
    batch = args.batch or (1 if args.quick else 2)
    models = args.models or (['PPMA-T'] if args.quick else list(MODELS))
    modes = args.modes or (['infer-fp32', 'train-fp32'] if args.quick else list(MODES))
    repeats = args.repeats or (50 if args.quick else 300)
    names = list(models) + (list(release_models()) if args.release_dir else [])
    print(f'host cost per step: simulated sm_{os.environ[SIMULATE]}, impl=auto, input {batch} x 3 x {shape[0]} x '
          f'{shape[1]}, launches stubbed', flush=True)
    results = {}
    for name in names:
        results[name] = count_model(name, modes, shape, batch, args.release_dir)
        print(f'  {name}: ' + ', '.join(f"{m} {r['launches']}" for m, r in results[name].items()), flush=True)
    lines = step_table(results, modes) + [''] + region_table(results, modes)
    times = None
    if not args.no_ops:
        times = op_times(repeats)
        lines += ['', f'host time per call, shapes (2, 2, 4, 4, 16), launches stubbed, one thread, least of '
                      f'{repeats}:', ''] + op_table(times)
    print('\n'.join(lines))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(shape=shape, batch=batch, steps=results, op_times=times), f, indent=1)
    for line in check(results, times, TARGETS):
        print(f'target not met: {line}')
    failed = check(results, times, BOUNDS)
    for line in check(results, times, TIME_BOUNDS):
        if args.check_times:
            failed.append(line)
        else:
            print(f'time bound not met (a benchmark: --check-times): {line}')
    for line in failed:
        print(f'BOUND FAILED: {line}')
    return 1 if failed and (args.check or args.check_times) else 0


if __name__ == '__main__':
    sys.exit(main())
