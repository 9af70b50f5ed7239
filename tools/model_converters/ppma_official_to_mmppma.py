#!/usr/bin/env python
"""Convert an official PPMA / RMT release checkpoint (zhongchenzhao/PPMA: ``classification/models/PPMA.py`` and
``RMT.py`` at commit 088b82d, ``detection/ppma.py`` at d556292, ``segmentation/ppma.py`` at 088b82d; one key
layout) to mmppma's layout.

    python tools/model_converters/ppma_official_to_mmppma.py SRC DST [--backbone-only] [--backbone-out PATH]

Classification checkpoints (state under ``model`` / ``model_ema`` / ``models``) become a full mmpretrain
ImageClassifier state (``backbone.*`` + ``head.{proj,norm,fc}.*``) for ``configs/ppma_*_in1k.py``; load with
``mmpretrain.apis.init_model(config, DST)``. Downstream checkpoints (``state_dict`` with a ``backbone.``
prefix) keep their detector / segmentor keys. ``--backbone-only`` writes only ``backbone.*`` keys, for
``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``; ``--backbone-out`` writes that
file in addition to DST. Every key and shape is checked against the model built from the detected arch;
any missing, unexpected or mis-shaped key is an error that lists them.
"""
import argparse
import json
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))  # run from a checkout

from mmppma.models.utils.checkpoint_convert import (CheckpointMismatchError, extract_state_dict,  # noqa: E402
                                                    official_to_mmppma)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='official checkpoint (.pth)')
    parser.add_argument('dst', help='output mmppma checkpoint (.pth)')
    parser.add_argument('--backbone-only', action='store_true', help='write only the backbone.* keys to DST')
    parser.add_argument('--backbone-out', help='also write a backbone-only checkpoint to this path')
    parser.add_argument('--key', help='where the state dict is (default: first of model, model_ema, models, '
                        'state_dict)')
    parser.add_argument('--arch-json', help='custom arch as JSON (keys of PPMA arch dicts) when the checkpoint '
                        'matches no named arch')
    parser.add_argument('--allow-pickle', action='store_true',
                        help='load with torch.load(weights_only=False): needed when the file holds non-tensor '
                        'objects (e.g. an argparse Namespace); only for files you trust')
    return parser.parse_args(argv)


def load(path: str, allow_pickle: bool) -> dict:
    try:
        return torch.load(path, map_location='cpu', weights_only=not allow_pickle)
    except Exception as e:  # pickle.UnpicklingError with weights_only=True
        if allow_pickle:
            raise
        raise SystemExit(f'error: {path} could not be loaded with weights_only=True ({type(e).__name__}: '
                         f'{str(e).splitlines()[0]}). If you trust the file, re-run with --allow-pickle.')


def main(argv=None) -> int:
    args = parse_args(argv)
    checkpoint = load(args.src, args.allow_pickle)
    state, where = extract_state_dict(checkpoint, args.key)
    arch = json.loads(args.arch_json) if args.arch_json else None
    try:
        converted, info = official_to_mmppma(state, backbone_only=args.backbone_only, arch=arch)
    except CheckpointMismatchError as e:
        raise SystemExit(f'error: {e}')
    meta = dict(converted_from=osp.basename(args.src), source_key=where, family=info['family'],
                arch=str(info['arch']), mask=info['mask'])
    torch.save(dict(meta=meta, state_dict=converted), args.dst)
    print(f'{args.src} [{where or "<root>"}] -> {args.dst}: {info["family"]}-{info["arch"]} ({info["mask"]} mask), '
          f'{len(converted)} tensors' + (f', {len(info["passthrough"])} non-backbone keys passed through'
                                         if info['passthrough'] else ''))
    if args.backbone_out:
        backbone = {k: v for k, v in converted.items() if k.startswith('backbone.')}
        torch.save(dict(meta=dict(meta, backbone_only=True), state_dict=backbone), args.backbone_out)
        print(f'backbone only -> {args.backbone_out}: {len(backbone)} tensors')
    return 0


if __name__ == '__main__':
    sys.exit(main())
