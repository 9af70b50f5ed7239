#!/usr/bin/env python
"""Export an mmppma model to ONNX and check the file in onnxruntime (CPU) against torch eager.

    python tools/deployment/pytorch2onnx.py CONFIG [CHECKPOINT] --shape H W [--batch B] [--dynamic]
                                            [--out FILE] [--backbone-only] [--cfg-options k=v ...]

What is exported, by the config's model: an mmpretrain classifier -> logits; an mmseg encoder-decoder ->
segmentation logits at the input size; an mmdet detector -> the backbone and neck features (its heads, NMS
and RoI ops need mmdeploy); a bare backbone (a config whose ``model`` is e.g. ``type='mmppma.PPMA'``, or
``--backbone-only``) -> its multi-scale features. The input is the normalized image batch (B, 3, H, W), as
after the model's data preprocessor. Without CHECKPOINT the weights are random.

``--dynamic`` makes batch, height and width dynamic wherever the model allows and checks a second input
size. The tool prints the largest relative difference (max |onnx - torch| / max |torch| over each output)
and exits 1 when it exceeds 1e-4, 2 when the export fails (the message names the op). docs/deployment.md.
"""
import argparse
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))  # run from a checkout

from mmppma.deploy import (  # noqa: E402
    OUTPUTS,
    TOLERANCE,
    ExportError,
    compare_onnx,
    dynamic_axes,
    export_module,
    export_onnx,
    fixed_grid_pools,
)


def parse_args(argv=None) -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='OpenMMLab config file')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint to load (default: random weights)')
    parser.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'), help='input size')
    parser.add_argument('--batch', type=int, default=1, help='batch size of the traced input (default 1)')
    parser.add_argument('--dynamic', action='store_true',
                        help='dynamic batch, height and width where the model allows; checks a second size')
    parser.add_argument('--out', help='ONNX file to write (default: the config name with .onnx, here)')
    parser.add_argument('--backbone-only', action='store_true', help="export the config's backbone alone")
    parser.add_argument('--opset', type=int, default=18, help='ONNX opset version (default 18)')
    parser.add_argument('--seed', type=int, default=0, help='seed of the random weights and inputs')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='override config entries, e.g. model.backbone.mask=v2h')
    args = parser.parse_args(argv)
    if args.batch < 1 or min(args.shape) < 1:
        parser.error(f'--batch and --shape must be positive; got --batch {args.batch} --shape {args.shape}')
    return args


def build_model(config: str, checkpoint=None, backbone_only: bool = False, cfg_options=None) -> torch.nn.Module:
    """The config's model (or its backbone) on CPU in eval mode, SyncBN reverted to BatchNorm, with the
    checkpoint's weights if given."""
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS, DefaultScope
    from mmengine.runner import load_checkpoint

    from mmppma.utils import register_scope_modules
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(cfg_options or {})
    scope = cfg.get('default_scope', 'mmengine')
    register_scope_modules(scope)
    model_cfg = cfg.model.backbone if backbone_only else cfg.model
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(model_cfg)
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu', revise_keys=[(r'^backbone\.', '')] if backbone_only
                        else [(r'^module\.', '')])
    return revert_sync_batchnorm(model).eval()


def second_input(x: torch.Tensor, axes) -> torch.Tensor:
    """An input of another size along each dynamic axis: one more image, 32 more pixels."""
    b, c, h, w = x.shape
    return torch.randn(b + ('batch' in axes), c, h + 32 * ('height' in axes), w + 32 * ('width' in axes))


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model = build_model(args.config, args.checkpoint, args.backbone_only, args.cfg_options)
    module, kind = export_module(model)
    out = args.out or osp.splitext(osp.basename(args.config))[0] + ('_backbone' if args.backbone_only else '') + '.onnx'
    x = torch.randn(args.batch, 3, *args.shape)
    print(f'exporting {osp.basename(args.config)} as a {kind}: {OUTPUTS[kind]}')
    pools = fixed_grid_pools(module) if args.dynamic else []
    if pools:
        print(f'height and width stay static: {", ".join(pools)} pool to fixed grids, which the exporter '
              'translates for the traced size only')
    try:
        export_onnx(module, x, out, dynamic=args.dynamic, opset=args.opset)
    except ExportError as err:
        print(err, file=sys.stderr)
        return 2
    inputs = [x]
    if args.dynamic:
        axes = dynamic_axes(out)
        print(f'dynamic axes: {", ".join(axes) if axes else "none (the model fixes every axis)"}')
        if axes:
            inputs.append(second_input(x, axes))
    worst = 0.0
    for shape, diff in compare_onnx(out, module, inputs):
        print(f'onnxruntime (CPU) vs torch at input {shape}: max relative difference {diff:.3e}')
        worst = max(worst, diff)
    print(f'wrote {out}')
    if not worst <= TOLERANCE:  # also catches NaN
        print(f'FAILED: the largest relative difference {worst:.3e} exceeds {TOLERANCE:g}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
