"""The command line shared by the MLLA and VMINet release converters (``mlla_official_to_mmppma.py``,
``vminet_official_to_mmppma.py``): the same flags and output files as ``ppma_official_to_mmppma.py``, whose
loader (``--allow-pickle``) it reuses; the mapping is
:func:`mmppma.models.utils.checkpoint_convert_baselines.release_to_mmppma`. It prints the config to load the
result with on a line of its own, ``config: PATH``.
"""
import argparse
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))  # run from a checkout

from mmppma.models.utils.checkpoint_convert import CheckpointMismatchError  # noqa: E402
from mmppma.models.backbones.vminet import RELEASE_RECORD  # noqa: E402
from mmppma.models.utils.checkpoint_convert_baselines import (ARCH_NAMES, ZOOS, extract_release_state,  # noqa: E402
                                                              release_to_mmppma, with_release_record)
from ppma_official_to_mmppma import load  # noqa: E402  (same folder)


def parse_args(family: str, doc: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help=f'official {family} checkpoint (.pth / .pth.tar)')
    parser.add_argument('dst', help='output mmppma checkpoint (.pth)')
    parser.add_argument('--arch', choices=sorted(ZOOS[family]), type=str.lower,
                        help=f'{family} arch ({", ".join(ARCH_NAMES[family])} or their long names); default: '
                        'detected from the shapes')
    parser.add_argument('--backbone-only', action='store_true', help='write only the backbone.* keys to DST')
    parser.add_argument('--backbone-out', help='also write a backbone-only checkpoint to this path')
    parser.add_argument('--key', help='where the state dict is (default: first of model, model_ema, models, '
                        'state_dict, then state_dict_ema)')
    default = ('vminet_<arch>_release-<revision>_in1k.py' if family == 'VMINet' else
               f'{family.lower()}_<arch>_8xb128_in1k.py')
    parser.add_argument('--config', help=f'mmpretrain config to check against (default: configs/{default})')
    parser.add_argument('--allow-pickle', action='store_true',
                        help='load with torch.load(weights_only=False): needed when the file holds non-tensor '
                        'objects (the releases pickle their training config / args); only for files you trust')
    return parser.parse_args(argv)


def main(family: str, doc: str, argv=None) -> int:
    args = parse_args(family, doc, argv)
    checkpoint = load(args.src, args.allow_pickle)
    state, where = extract_release_state(checkpoint, args.key)
    try:
        converted, info = release_to_mmppma(state, family, backbone_only=args.backbone_only, arch=args.arch,
                                            config=args.config)
    except CheckpointMismatchError as e:
        raise SystemExit(f'error: {e}')
    meta = dict(converted_from=osp.basename(args.src), source_key=where, family=family, arch=str(info['arch']),
                config=info.get('config'), backbone_overrides=info['backbone_overrides'],
                dropped=len(info['dropped']))
    release = info.get('release')
    if release:
        meta[RELEASE_RECORD] = release
    torch.save(dict(meta=meta, state_dict=converted), args.dst)
    print(f'{args.src} [{where or "<root>"}] -> {args.dst}: {family}-{info["arch"]}, {len(converted)} tensors'
          + (f', {len(info["passthrough"])} non-backbone keys passed through' if info['passthrough'] else ''))
    if info['backbone_overrides']:
        print('the checkpoint needs these backbone settings in your config: ' +
              ', '.join(f'{k}={v!r}' for k, v in info['backbone_overrides'].items()))
    for note in info['notes']:
        print(f'note: {note}')
    if release:
        options = ', '.join(f'{k}={v!r}' for k, v in release.items() if k != 'revision')
        print(f'{family} release revision {release["revision"]} (from the keys): {options}')
    if info.get('config'):
        config = osp.relpath(info['config'])
        config = info['config'] if config.startswith('..') else config
        print(f'config: {config}')
        if args.backbone_only:
            if release:
                print(f'for init_cfg=dict(type=\'Pretrained\', checkpoint={args.dst!r}, prefix=\'backbone.\') the '
                      f'backbone needs {options}')
        elif not info['downstream']:
            print(f'load: mmpretrain.apis.init_model({config!r}, {args.dst!r})')
    if args.backbone_out:
        backbone = {k: v for k, v in converted.items() if k.startswith('backbone.')}
        backbone = with_release_record(backbone, release) if release else backbone
        torch.save(dict(meta=dict(meta, backbone_only=True), state_dict=backbone), args.backbone_out)
        print(f'backbone only -> {args.backbone_out}: {len(backbone)} tensors')
    return 0
