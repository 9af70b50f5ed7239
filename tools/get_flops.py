#!/usr/bin/env python
"""FLOPs and parameters with mmengine's counter, attention included (mmppma.models.flops).

    # a release classifier (backbone + its family's release head, 1000 classes), no downstream library needed:
    # any variant of a registered family (PPMA, RMT, MLLA, PPMLA, VMINet; PPMA's mask and form as options)
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

from mmppma.models.backbones.family import variant_of, variants  # noqa: E402
from mmppma.models.flops import count_flops  # noqa: E402
from mmppma.models.heads import release_head  # noqa: E402


class Classifier(nn.Module):
    """Backbone + the family's release head (``FamilySpec.head``): the release classifier, built without
    mmpretrain."""

    def __init__(self, backbone: nn.Module, head: str, num_classes: int = 1000) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = release_head(head, backbone.embed_dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head.fc(self.head.project(self.backbone(x)[-1]).mean(dim=(2, 3)))


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
    parser.add_argument('--model', choices=[v.name for v in variants()], help='build a classifier directly')
    parser.add_argument('--arch', default='tiny', help="with --model: a name of its arch table ('tiny', ...)")
    parser.add_argument('--mask', help="with --model PPMA: the mask's decays (Table 4; default polyline)")
    parser.add_argument('--form', help="with --model PPMA: the ops' form (release, paper, v2h; default release)")
    parser.add_argument('--shape', type=int, nargs=2, default=[224, 224], metavar=('H', 'W'))
    parser.add_argument('--backbone-only', action='store_true', help='count the backbone only')
    parser.add_argument('--by-operator', action='store_true', help='print the per-operator breakdown')
    args = parser.parse_args(argv)
    if (args.config is None) == (args.model is None):
        parser.error('give either a config file or --model')
    return args


def build(args: argparse.Namespace) -> Tuple[nn.Module, str]:
    if args.model:
        variant = variant_of(args.model)
        spec = variant.family
        given = {k: v for k, v in (('mask', args.mask), ('form', args.form)) if v is not None}
        backbone = variant.build(args.arch, out_indices=(-1, ), **spec.classifier_options, **given)
        name = f'{args.model}-{args.arch}' + (f' ({", ".join(f"{k} {v}" for k, v in given.items())})' if given else '')
        return (backbone if args.backbone_only else Classifier(backbone, spec.head)), name
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
