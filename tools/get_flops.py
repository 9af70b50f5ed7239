#!/usr/bin/env python
"""FLOPs and parameters with mmengine's counter, attention included (mmppma.models.flops).

    # a PPMA/RMT classifier (backbone + release head, 1000 classes), no downstream library needed
    python tools/get_flops.py --model PPMA --arch tiny [--mask polyline] [--form release] [--shape 224 224]
    # any OpenMMLab 2.0 config whose model runs as model(x, mode='tensor') (mmpretrain, mmseg, mmdet)
    python tools/get_flops.py configs/ppma_t_8xb128_in1k.py [--backbone-only] [--shape 224 224]

One multiply-add counts as one FLOP (mmengine's and fvcore's convention, the one papers quote).
"""
import argparse
import os.path as osp
import sys
from typing import Tuple

import torch
import torch.nn as nn

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))  # run from a checkout

from mmppma.models import PPMA, RMT, PPMAClsHead  # noqa: E402
from mmppma.models.flops import count_flops  # noqa: E402


class Classifier(nn.Module):
    """Backbone + PPMAClsHead: the release classifier, built without mmpretrain."""

    def __init__(self, backbone: nn.Module, num_classes: int = 1000) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = PPMAClsHead(num_classes, in_channels=backbone.embed_dims[-1], loss=nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


class TensorMode(nn.Module):
    """An OpenMMLab model called as ``model(x, mode='tensor')``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor):
        return self.model(x, mode='tensor')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', nargs='?', help='OpenMMLab config file (or use --model)')
    parser.add_argument('--model', choices=['PPMA', 'RMT'], help='build a classifier directly')
    parser.add_argument('--arch', default='tiny', help="with --model: 'tiny' | 'small' | 'base'")
    parser.add_argument('--mask', default='polyline', help="with --model PPMA: the mask's decays (Table 4)")
    parser.add_argument('--form', default='release', help="with --model PPMA: the ops' form (release, paper, v2h)")
    parser.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'))
    parser.add_argument('--backbone-only', action='store_true', help='count the backbone only')
    parser.add_argument('--by-operator', action='store_true', help='print the per-operator breakdown')
    args = parser.parse_args(argv)
    if (args.config is None) == (args.model is None):
        parser.error('give either a config file or --model')
    return args


def build(args: argparse.Namespace) -> Tuple[nn.Module, str]:
    if args.model:
        backbone = (PPMA(args.arch, mask=args.mask, form=args.form, out_indices=(3, ), out_norm=False)
                    if args.model == 'PPMA' else RMT(args.arch, out_indices=(3, ), out_norm=False))
        name = f'{args.model}-{args.arch}' + (f' ({args.mask} mask, form {args.form})' if args.model == 'PPMA' else '')
        return (backbone if args.backbone_only else Classifier(backbone)), name
    from mmppma.utils.configs import build_config_model
    model = build_config_model(args.config)
    return (model.backbone if args.backbone_only else TensorMode(model)), osp.basename(args.config)


def main(argv=None) -> int:
    args = parse_args(argv)
    model, name = build(args)
    model.eval()
    h, w = args.shape
    total, by_op = count_flops(model, torch.randn(1, 3, h, w))
    params = sum(p.numel() for p in model.parameters())
    what = 'backbone' if args.backbone_only else 'model'
    print(f'{name} {what} at {h}x{w}: {total / 1e9:.3f} GFLOPs, {params / 1e6:.3f} M parameters ({params:,})')
    if args.by_operator:
        for op, n in sorted(by_op.items(), key=lambda kv: -kv[1]):
            print(f'  {op:40s} {n / 1e9:8.3f} G')
    return 0


if __name__ == '__main__':
    sys.exit(main())
