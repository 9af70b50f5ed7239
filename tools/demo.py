"""PPMA smoke run: build the backbone from a config dict, run forward + backward on a random batch.

The model is built through mmengine's root MODELS registry with ``type='mmppma.PPMA'``, the way a
downstream config names it: mmengine imports mmppma on demand, nothing is imported by hand.

    python tools/demo.py [--arch tiny] [--batch 2] [--size 224] [--device cpu] [--iters 2]
"""
import argparse
import time
from typing import Sequence

import torch
from mmengine.registry import MODELS


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--arch', default='tiny', help='PPMA arch name (tiny, small, base)')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--size', type=int, default=224, help='input height and width')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--iters', type=int, default=2, help='timed forward+backward steps (first one is cold)')
    return parser.parse_args(argv)


def check_outputs(outs: Sequence[torch.Tensor], batch: int, n_outputs: int) -> None:
    """The backbone interface downstream necks rely on: a tuple of finite NCHW tensors."""
    if not isinstance(outs, tuple) or len(outs) != n_outputs:
        raise SystemExit(f'expected a tuple of {n_outputs} feature maps, got {type(outs).__name__} '
                         f'of length {len(outs) if hasattr(outs, "__len__") else "?"}')
    for i, out in enumerate(outs):
        if out.dim() != 4 or out.shape[0] != batch or not torch.isfinite(out).all():
            raise SystemExit(f'output {i}: expected a finite (N, C, H, W) tensor with N={batch}, '
                             f'got shape {tuple(out.shape)}')


def main(argv=None) -> None:
    args = parse_args(argv)
    out_indices = (0, 1, 2, 3)
    cfg = dict(type='mmppma.PPMA', arch=args.arch, out_indices=out_indices)
    print(f'torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads')
    print(f'building {cfg}')
    start = time.perf_counter()
    try:
        model = MODELS.build(cfg)
    except KeyError as err:
        raise SystemExit(f'{err}\nmmppma.PPMA is not registered: is mmppma installed (bash tools/setup_env.sh) '
                         'and does mmppma/models/backbones define PPMA?') from err
    if hasattr(model, 'init_weights'):
        model.init_weights()
    model.to(args.device).train()
    build_s = time.perf_counter() - start
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f'built {type(model).__name__} in {build_s:.2f} s: {n_params:,} parameters ({n_trainable:,} trainable)')

    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    # a fixed random projection of every output (their plain mean is ~0 after the output LayerNorms)
    projections = None
    for step in range(args.iters):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        outs = model(x)
        forward_s = time.perf_counter() - start
        check_outputs(outs, args.batch, len(out_indices))
        if projections is None:
            projections = [torch.randn_like(out, dtype=torch.float32) for out in outs]
        loss = sum((out.float() * p).mean() for out, p in zip(outs, projections))
        start = time.perf_counter()
        loss.backward()
        backward_s = time.perf_counter() - start
        if step == 0:
            for i, out in enumerate(outs):
                print(f'  out[{i}]: {tuple(out.shape)} (stride {args.size // out.shape[-1]})')
            missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            if missing:
                raise SystemExit(f'{len(missing)} parameters got no gradient, e.g. {missing[:5]}')
        label = 'cold' if step == 0 else 'warm'
        print(f'step {step} ({label}): forward {forward_s * 1e3:.0f} ms, backward {backward_s * 1e3:.0f} ms, '
              f'loss {loss.item():.4f}')
    print('PPMA smoke run OK')


if __name__ == '__main__':
    main()
