#!/usr/bin/env python
"""Convert a release checkpoint of a registered family (PPMA / RMT, MLLA or VMINet) to mmppma's layout.

    python tools/model_converters/release_to_mmppma.py --family {PPMA,RMT,MLLA,VMINet} SRC DST [--arch ARCH]
        [--arch-json JSON] [--backbone-only] [--backbone-out PATH] [--key KEY] [--config CONFIG] [--allow-pickle]
    python tools/model_converters/release_to_mmppma.py --family PPMA SRC DST --model-config CONFIG

The release layouts read:

* PPMA / RMT: zhongchenzhao/PPMA, ``classification/models/{PPMA,RMT}.py`` at commit 088b82d (downstream:
  ``detection/ppma.py`` at d556292, ``segmentation/ppma.py`` at 088b82d). The head ``proj``, ``norm``,
  ``head`` becomes ``head.{proj,norm,fc}`` (PPMAClsHead).
* MLLA: LeapLabTHU/MLLA, ``models/mlla.py`` at commit 5a17196 (``cfgs/mlla_{t,s,b}.yaml``). The fixed RoPE
  buffers (``*.attn.rope.rotations``) are dropped (mmppma computes RoPE per input size); the final ``norm``
  becomes ``backbone.norm3``, ``head`` ``head.fc``.
* VMINet: yws-wxs/VMINet, ``vminet.py`` at commit 6b11d4a or 7c2632c, told apart by the keys: blocks'
  ``dwconv`` with ``g.bn`` is 6b11d4a (``context_mask='none', proj_norm=True``), blocks' ``conv`` without
  ``g.bn`` is 7c2632c (``context_mask='tril', proj_norm=False``; ``conv.`` renamed ``dwconv.``). DST records
  the revision and its options (``meta['mmppma_vminet_release']`` and the state dict's load metadata);
  loading it into a VMINet whose ``context_mask`` or ``proj_norm`` differs is an error naming the option.

Two steps: convert (this script prints the config to load the result with on a line of its own, ``config:
configs/<family>_<arch>_8xb128_in1k.py``, for VMINet ``configs/vminet_<arch>_release-<revision>_in1k.py``),
then load with ``mmpretrain.apis.init_model(CONFIG, DST)`` (printed too).

Classification checkpoints (state under ``model`` / ``model_ema`` / ``models`` / ``state_dict``, then
``state_dict_ema``; ``--key`` names another) become a full mmpretrain ImageClassifier state. Downstream
checkpoints (``backbone.`` prefix) keep their detector / segmentor keys. ``--backbone-only`` writes only
``backbone.*`` keys, for ``init_cfg=dict(type='Pretrained', checkpoint=DST, prefix='backbone.')``;
``--backbone-out`` writes that file in addition to DST. The arch is detected from the shapes unless given;
every key and shape is checked against the model built from the arch table (or ``--config``, which for
VMINet must have the revision's options); any missing, unexpected or mis-shaped key is an error that lists
them. Release files often pickle their training config: pass ``--allow-pickle`` for a file you trust.

Whole release detectors and segmentors (the PPMA release's Mask R-CNN, mmdet 2.x, and UPerNet, mmseg 0.x):
``--model-config CONFIG`` (e.g. ``configs/mask_rcnn_ppma_t_1x_coco.py``,
``configs/upernet_ppma_t_512x512_160k_ade20k.py``) checks every key and shape of the converted checkpoint
against the whole model that config builds under mmdet 3 / mmseg 1 and writes the class names as
``meta['dataset_meta']`` (``mmppma.models.conversion.whole_model_convert``); ``tools/test.py CONFIG DST`` then loads
it strictly.
"""
import argparse
import json
import os.path as osp
import sys
from pathlib import Path
from typing import List, Optional

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from a checkout

from mmppma.models.backbones.family import FAMILIES, family_of  # noqa: E402
from mmppma.models.conversion.checkpoint_convert import (  # noqa: E402
    CheckpointMismatchError,
    check_family,
    extract_state_dict,
    release_to_mmppma,
    with_release_record,
)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [n for spec in FAMILIES.values() for n in dict.fromkeys([spec.name, *(v.name for v in spec.variants)])]
    parser.add_argument('--family', required=True, type=check_family, metavar='{' + ','.join(names) + '}',
                        help=f'the release: {", ".join(FAMILIES)}, or a variant in its family\'s layout '
                        f'({", ".join(n for n in names if n not in FAMILIES)})')
    parser.add_argument('src', help='release checkpoint (.pth / .pth.tar)')
    parser.add_argument('dst', help='output mmppma checkpoint (.pth)')
    parser.add_argument('--arch', type=str.lower, help='arch name (e.g. tiny, t, ti, xs); default: detected from '
                        'the shapes')
    parser.add_argument('--arch-json', help='custom arch as JSON (keys of the arch dicts) when the checkpoint matches '
                        'no named arch, for a family whose custom arch needs settings the weights do not show (PPMA: '
                        'its attn_types)')
    parser.add_argument('--backbone-only', action='store_true', help='write only the backbone.* keys to DST')
    parser.add_argument('--backbone-out', help='also write a backbone-only checkpoint to this path')
    parser.add_argument('--key', help='where the state dict is (default: first of model, model_ema, models, '
                        'state_dict, then state_dict_ema)')
    parser.add_argument('--config', help='mmpretrain classification config to check against (default: the '
                        'backbone from its arch table)')
    parser.add_argument('--model-config', help='mmdet / mmseg config the whole release detector / segmentor must '
                        'fit (every key and shape checked); writes meta.dataset_meta from the release meta')
    parser.add_argument('--allow-pickle', action='store_true',
                        help='load with torch.load(weights_only=False): needed when the file holds non-tensor '
                        'objects (e.g. the training config / args); only for files you trust')
    args = parser.parse_args(argv)
    if args.arch_json and args.arch:
        parser.error('give --arch or --arch-json, not both')
    if args.arch_json and not family_of(args.family).custom_arch:
        custom = ', '.join(name for name, spec in FAMILIES.items() if spec.custom_arch)
        parser.error(f'--arch-json is for {custom}; for {args.family} give --arch or --config')
    if args.model_config and (args.config or args.backbone_only or args.backbone_out or args.arch or args.arch_json):
        parser.error('--model-config converts a whole detector / segmentor: give it without --config, --arch, '
                     '--arch-json, --backbone-only and --backbone-out')
    return args


def load(path: str, allow_pickle: bool) -> dict:
    try:
        return torch.load(path, map_location='cpu', weights_only=not allow_pickle)
    except Exception as e:  # pickle.UnpicklingError with weights_only=True
        if allow_pickle:
            raise
        raise SystemExit(f'error: {path} could not be loaded with weights_only=True ({type(e).__name__}: '
                         f'{str(e).splitlines()[0]}). If you trust the file, re-run with --allow-pickle.')


def shown_config(info: dict, given: Optional[str]) -> Optional[str]:
    """The config line's path: the given config, else the repository's (relative to the working directory
    when it is below it)."""
    if not (given or info.get('config')):
        return None
    path = Path(given) if given else REPO / info['config']
    relative = osp.relpath(path.resolve())
    return str(path) if relative.startswith('..') else relative


def convert_whole_model(args: argparse.Namespace, checkpoint: dict) -> int:
    """--model-config: the whole release detector / segmentor, checked against the config's model."""
    from mmppma.models.conversion.whole_model_convert import convert_whole_release
    try:
        converted, info = convert_whole_release(checkpoint, args.family, args.model_config)
    except (CheckpointMismatchError, ValueError) as e:
        raise SystemExit(f'error: {e}')
    torch.save(converted, args.dst)
    print(f'{args.src} -> {args.dst}: {info["family"]}-{info["arch"]} {info["model"]}, '
          f'{len(converted["state_dict"])} tensors, every key of {args.model_config} matched'
          + (f'; meta.dataset_meta: {", ".join(info["dataset_meta"])}' if info['dataset_meta'] else ''))
    print(f'test: python tools/test.py {args.model_config} {args.dst}')
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    family = args.family
    checkpoint = load(args.src, args.allow_pickle)
    if args.model_config:
        return convert_whole_model(args, checkpoint)
    state, where = extract_state_dict(checkpoint, args.key)
    arch = json.loads(args.arch_json) if args.arch_json else args.arch
    try:
        converted, info = release_to_mmppma(state, family, backbone_only=args.backbone_only, arch=arch,
                                            config=args.config)
    except (CheckpointMismatchError, ValueError) as e:
        raise SystemExit(f'error: {e}')
    config = shown_config(info, args.config)
    name = f'{info["family"]}-{info["arch"] if isinstance(info["arch"], str) else "custom"}'
    meta = dict(converted_from=osp.basename(args.src), source_key=where, family=info['family'], arch=str(info['arch']),
                config=config, backbone_overrides=info['backbone_overrides'], dropped=len(info['dropped']))
    if 'mask' in info:
        meta['mask'] = info['mask']
    release, record = info.get('release'), family_of(family).record
    if release:
        meta[record] = release
    torch.save(dict(meta=meta, state_dict=converted), args.dst)
    print(f'{args.src} [{where or "<root>"}] -> {args.dst}: {name}'
          + (f' ({info["mask"]} mask)' if 'mask' in info else '') + f', {len(converted)} tensors'
          + (f', {len(info["passthrough"])} non-backbone keys passed through' if info['passthrough'] else ''))
    if info['backbone_overrides']:
        print('the checkpoint needs these backbone settings in your config: ' +
              ', '.join(f'{k}={v!r}' for k, v in info['backbone_overrides'].items()))
    for note in info['notes']:
        print(f'note: {note}')
    options = ', '.join(f'{k}={v!r}' for k, v in (release or {}).items() if k != 'revision')
    if release:
        print(f'{family} release revision {release["revision"]} (from the keys): {options}')
    if config:
        print(f'config: {config}')
        if args.backbone_only:
            if release:
                print(f'for init_cfg=dict(type=\'Pretrained\', checkpoint={args.dst!r}, prefix=\'backbone.\') the '
                      f'backbone needs {options}')
        elif not info['downstream']:
            print(f'load: mmpretrain.apis.init_model({config!r}, {args.dst!r})')
    if args.backbone_out:
        backbone = {k: v for k, v in converted.items() if k.startswith('backbone.')}
        backbone = with_release_record(backbone, release, record) if release else backbone
        torch.save(dict(meta=dict(meta, backbone_only=True), state_dict=backbone), args.backbone_out)
        print(f'backbone only -> {args.backbone_out}: {len(backbone)} tensors')
    return 0


if __name__ == '__main__':
    sys.exit(main())
