#!/usr/bin/env python
"""What PPMLA (or PPMDA) allocates and launches, counted on ``meta`` tensors without a GPU: the bytes of every tensor
the forward's aten ops produce (views left out), the largest tensor of the forward and of the backward, the bytes
autograd saves for the backward, the Triton launches of each and the precision of their products.

    python tools/meta_count.py                         # MLLA-T stage 1: B 64, 2 heads, 56 x 56, d 32, fp16, sm_90
    python tools/meta_count.py --size 14 14 --heads 8 --dtype bf16 --op decomposed --cap 80
    python tools/meta_count.py --check                 # exit 1 when a bound of BOUNDS fails (the test tier's form)

The op runs with ``impl='triton'`` as MLLA calls it (normalized, the un-rotated features as the normalizer) on meta
tensors inside :func:`mmppma.ops.triton_support.launch.recording` (the launch table of ``--cap``): no arithmetic,
the same host code as on the GPU. ``PRECISION`` is the kernels' precision of products of input tiles (None: the
inputs' dtype on tensor cores), ``WIDE`` that of products with a computed float32 tile.
"""
import argparse
import os
import sys
from typing import Dict

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
#: the bounds ``--check`` enforces at any shape: bytes, and launches per forward and backward
BOUNDS = dict(forward_bytes=1.5e9, largest_bytes=0.25e9, saved_bytes=1.5e9, forward_launches=4,
              backward_launches=10)


def count(op: str = 'linear', batch: int = 64, heads: int = 2, size=(56, 56), dim: int = 32,
          dtype: torch.dtype = torch.float16, cap: int = 90) -> Dict[str, object]:
    """The counts of one forward and backward of ``op`` ('linear': PPMLA as MLLA calls it; 'decomposed': PPMDA)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from mmppma import ops
    from mmppma.ops import plan
    from mmppma.ops.triton_support import launch as lp

    class Produced(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not any(r.alias_info is not None for r in func._schema.returns):  # views and in-place ops: no new
                for t in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(t, torch.Tensor):
                        self.sizes.append(t.numel() * t.element_size())
            return out

    saved = {}

    def pack(t):
        saved[id(t)] = t.numel() * t.element_size()
        return t

    h, w = size

    def meta(*shape):
        return torch.empty(*shape, device='meta', dtype=dtype, requires_grad=True)
    q, k, v, qn, kn = (meta(batch, heads, h, w, dim) for _ in range(5))
    la, lb = meta(batch, heads, h, w), meta(batch, heads, h, w)
    call = {'linear': lambda: ops.ppma_linear_attention(q, k, v, la, lb, normalize=True, normalizer=(qn, kn),
                                                        form='2d', impl='triton'),
            'decomposed': lambda: ops.ppma_decomposed_attention(q, k, v, la, lb, form='2d', impl='triton')}[op]
    leaves = [q, k, v, la, lb] + ([qn, kn] if op == 'linear' else [])
    interpreted, plan.triton_interpreted = plan.triton_interpreted, lambda: True  # meta tensors accepted
    try:
        with lp.recording(cap) as forward, Produced() as produced, torch.autograd.graph.saved_tensors_hooks(
                pack, lambda t: t):
            out = call()
        with lp.recording(cap) as backward, Produced() as produced_backward:
            torch.autograd.grad(out, leaves, torch.empty_like(out))
    finally:
        plan.triton_interpreted = interpreted
    launches = forward + backward
    return dict(forward_bytes=sum(produced.sizes), forward_tensors=len(produced.sizes),
                largest_bytes=max(produced.sizes + produced_backward.sizes),
                largest_forward_bytes=max(produced.sizes), saved_bytes=sum(saved.values()), saved_tensors=len(saved),
                forward_launches=len(forward), backward_launches=len(backward),
                kernels=sorted({x.name for x in launches}),
                precision=sorted({str(x.constexprs.get('PRECISION')) for x in launches}),
                wide=sorted({str(x.constexprs.get('WIDE')) for x in launches}))


def failures(counts: Dict[str, object]) -> Dict[str, object]:
    """The counts over :data:`BOUNDS`, and the products of half-precision inputs not on tensor cores."""
    over = {name: counts[name] for name, bound in BOUNDS.items() if counts[name] > bound}
    if counts['precision'] != ['None']:
        over['precision'] = counts['precision']
    return over


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--op', choices=('linear', 'decomposed'), default='linear')
    parser.add_argument('--batch', type=int, default=64)
    parser.add_argument('--heads', type=int, default=2)
    parser.add_argument('--size', type=int, nargs=2, default=(56, 56), metavar=('H', 'W'))
    parser.add_argument('--dim', type=int, default=32)
    parser.add_argument('--dtype', choices=list(DTYPES), default='fp16')
    parser.add_argument('--cap', type=int, default=90, help='the launch table of this capability (default 90)')
    parser.add_argument('--check', action='store_true', help='exit 1 when a bound fails (half precision only)')
    args = parser.parse_args(argv)
    counts = count(args.op, args.batch, args.heads, tuple(args.size), args.dim, DTYPES[args.dtype], args.cap)
    print(f'{args.op} B {args.batch}, {args.heads} heads, {args.size[0]} x {args.size[1]}, d {args.dim}, '
          f'{args.dtype}, sm_{args.cap}')
    print(f'forward: {counts["forward_bytes"] / 1e9:.3f} GB in {counts["forward_tensors"]} tensors, largest '
          f'{counts["largest_forward_bytes"] / 1e9:.3f} GB (backward included: {counts["largest_bytes"] / 1e9:.3f} '
          f'GB)')
    print(f'saved for backward: {counts["saved_bytes"] / 1e9:.3f} GB in {counts["saved_tensors"]} tensors')
    print(f'launches: {counts["forward_launches"]} forward / {counts["backward_launches"]} backward '
          f'({", ".join(counts["kernels"])})')
    print(f'PRECISION {", ".join(counts["precision"])}; WIDE {", ".join(counts["wide"])}')
    if args.check:
        over = failures(counts) if args.dtype != 'fp32' else {
            name: counts[name] for name, bound in BOUNDS.items() if counts[name] > bound}
        print('bounds: ' + ('ok' if not over else f'FAILED {over}'))
        return 1 if over else 0
    return 0


if __name__ == '__main__':
    sys.exit(main())
