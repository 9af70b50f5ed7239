#!/usr/bin/env python
"""Export an mmppma model to ONNX and check the file in onnxruntime (CPU) against torch eager.

    python tools/deployment/pytorch2onnx.py CONFIG [CHECKPOINT] --shape H W [--batch B] [--dynamic]
                                            [--paste-masks] [--out FILE] [--backbone-only]
                                            [--cfg-options k=v ...] [--debug]

What is exported, by the config's model: an mmpretrain classifier -> logits; an mmseg encoder-decoder ->
segmentation logits at the input size; an mmdet Mask R-CNN -> the whole detector (mmppma/deploy/mask_rcnn.py):
its detections after NMS (boxes, scores, labels and the mask head's probabilities at RoI resolution, padded,
with their count; ``--paste-masks``: also the masks pasted at the input size) and its RPN and box head
outputs before NMS, at the batch and size given (any, with ``--dynamic``); a bare backbone (a config whose
``model`` is e.g. ``type='mmppma.PPMA'``, or ``--backbone-only``) -> its multi-scale features. The input is
the normalized image batch (B, 3, H, W), as after the model's data preprocessor. Without CHECKPOINT the
weights are random.

``--dynamic`` makes batch, height and width dynamic wherever the model allows (traced at a batch of 2 or
more) and checks the file at the input given (--batch, --shape), at one image more, and at one image more in
another size (H 3/4 and W 5/4 as large, in steps of 32: 512 x 512 -> 384 x 640); a Mask R-CNN is dynamic in
all three. The tool prints the largest relative difference (max |onnx - torch| / max |torch| over each
output) per input. A detector is checked against ``model.predict`` instead: the outputs before NMS within
1e-4 (relative), the detections equal in number and labels, their boxes within 1e-3 (relative, matched),
scores within 1e-4 and each mask's IoU at least 0.99 (or its pixels differing only where mmdet's probability
is within 1e-3 of the threshold); where equal objectness scores make mmdet's RPN keep other proposals than
with ties broken by index, against mmdet's post-processing with ties so broken. When a step fails it prints
one line naming the config, the step and the cause (``--debug``: with the traceback) and exits with the
step's code: 1 the outputs differ (by more than the bounds above, or in number or shape), 3 the export, 4
onnxruntime, 5 building the model or running it in torch (2: bad arguments, as argparse, or --paste-masks
with a model other than a detector).
docs/deployment.md.
"""
import argparse
import contextlib
import math
import os.path as osp
import sys
import traceback
import warnings
from dataclasses import replace

import torch

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..', '..'))  # run from a checkout

from mmppma.deploy import (  # noqa: E402
    ONNXRUNTIME_CPU,
    OUTPUTS,
    TOLERANCE,
    ExportError,
    OnnxRuntimeFailure,
    OutputMismatch,
    build_model,
    compare_onnx,
    dynamic_axes,
    export_module,
    export_onnx,
    first_line,
    fixed_grid_pools,
    model_kind,
)

#: exit code of each step that can fail (argparse exits with 2 on bad arguments)
EXIT_CODES = {'compare': 1, 'arguments': 2, 'export': 3, 'onnxruntime': 4, 'build': 5, 'torch': 5}


class StepFailed(Exception):
    """A step of the tool failed: ``step`` (a key of :data:`EXIT_CODES`) and the cause in one line."""

    def __init__(self, step: str, cause: str) -> None:
        super().__init__(f'{step} failed: {cause}')
        self.step, self.cause = step, cause


def parse_args(argv=None) -> argparse.Namespace:
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='OpenMMLab config file')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint to load (default: random weights)')
    parser.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'), help='input size')
    parser.add_argument('--batch', type=int, default=1,
                        help='batch of the input exported and checked (default 1; --dynamic traces at 2 or more)')
    parser.add_argument('--dynamic', action='store_true',
                        help='dynamic batch, height and width where the model allows; checks one image more, '
                        'and another size')
    parser.add_argument('--out', help='ONNX file to write (default: the config name with .onnx, here)')
    parser.add_argument('--paste-masks', action='store_true',
                        help='Mask R-CNN: also paste the masks into the image in the file (output masks, '
                        '(B, K, H, W) bool) besides mask_probs at RoI resolution')
    parser.add_argument('--backbone-only', action='store_true', help="export the config's backbone alone")
    parser.add_argument('--opset', type=int, default=ONNXRUNTIME_CPU.opset,
                        help=f'ONNX opset version (default {ONNXRUNTIME_CPU.opset}, onnxruntime\'s target)')
    parser.add_argument('--seed', type=int, default=0, help='seed of the random weights and inputs')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='override config entries, e.g. model.backbone.form=v2h')
    parser.add_argument('--debug', action='store_true', help='on a failure, print the traceback too')
    args = parser.parse_args(argv)
    if args.batch < 1 or min(args.shape) < 1:
        parser.error(f'--batch and --shape must be positive; got --batch {args.batch} --shape {args.shape}')
    return args


def check_inputs(x: torch.Tensor, axes) -> list:
    """The inputs the file is checked at: ``x``; with a dynamic batch, one image more; with a dynamic height
    or width, also one image more (if the batch allows) at H 3/4 and W 5/4 as large, in steps of 32 (512 x 512
    -> 384 x 640; at least 32)."""
    b, c, h, w = x.shape
    inputs = [x]
    more = b + ('batch' in axes)
    if 'batch' in axes:
        inputs.append(torch.randn(more, c, h, w))
    if 'height' in axes or 'width' in axes:
        h2 = max(32, math.floor(0.75 * h / 32) * 32) if 'height' in axes else h
        w2 = max(32, math.ceil(1.25 * w / 32) * 32) if 'width' in axes else w
        inputs.append(torch.randn(more, c, h2, w2))
    return inputs


def convert(args: argparse.Namespace) -> int:
    """Build, export and check; a failing step raises :class:`StepFailed`."""
    torch.manual_seed(args.seed)
    try:
        model = build_model(args.config, args.checkpoint, args.backbone_only, args.cfg_options)
        kind = model_kind(model)
    except Exception as err:  # a bad config, a missing package or checkpoint: the cause says which
        raise StepFailed('build', first_line(err)) from err
    try:
        module, kind = export_module(model, paste_masks=args.paste_masks)
    except ValueError as err:  # a detector other than Mask R-CNN (the export's failure), --paste-masks elsewhere
        step = 'export' if type(err).__name__ == 'UnsupportedDetector' else 'arguments'
        raise StepFailed(step, str(err)) from err
    except Exception as err:  # a missing package
        raise StepFailed('build', first_line(err)) from err
    out = args.out or osp.splitext(osp.basename(args.config))[0] + ('_backbone' if args.backbone_only else '') + '.onnx'
    x = torch.randn(args.batch, 3, *args.shape)
    print(f'exporting {osp.basename(args.config)} as a {kind}: {OUTPUTS[kind]}')
    pools = fixed_grid_pools(module)
    if pools:
        print(f'exported with bins taken from the input size at run time: {", ".join(pools)} (fixed-grid pools)')
    try:
        export_onnx(module, x, out, dynamic=args.dynamic, target=replace(ONNXRUNTIME_CPU, opset=args.opset))
    except ExportError as err:
        raise StepFailed('export', str(err).splitlines()[0]) from err
    inputs = [x]
    if args.dynamic:
        axes = dynamic_axes(out)
        print(f'dynamic axes: {", ".join(axes) if axes else "none (the model fixes every axis)"}')
        inputs = check_inputs(x, axes)
    if kind == 'detector':
        return check_detector(out, model, inputs)
    with checking(OutputMismatch, 'torch eager failed on a check input'):
        comparisons = compare_onnx(out, module, inputs)
    worst, at = 0.0, None
    for shape, diff in comparisons:
        print(f'onnxruntime (CPU) vs torch at input {shape}: max relative difference {diff:.3e}')
        if not math.isnan(worst) and not diff <= worst:  # a NaN is the worst and stays so
            worst, at = diff, shape
    print(f'wrote {out}')
    if not worst <= TOLERANCE:
        raise StepFailed('compare', f'the largest relative difference {worst:.3e} (at input {at}) exceeds '
                         f'{TOLERANCE:g}')
    return 0


@contextlib.contextmanager
def checking(mismatch: type, torch_failed: str):
    """Within the block, the check's failures as :class:`StepFailed`: onnxruntime's ('onnxruntime'), a
    ``mismatch`` ('compare') and any other error, which comes from torch ('torch', after ``torch_failed``)."""
    try:
        yield
    except OnnxRuntimeFailure as err:
        raise StepFailed('onnxruntime', str(err)) from err
    except mismatch as err:
        raise StepFailed('compare', str(err)) from err
    except Exception as err:  # the torch side of the check
        raise StepFailed('torch', f'{torch_failed}: {first_line(err)}') from err


def check_detector(out: str, model: torch.nn.Module, inputs) -> int:
    """Check the whole-detector file against ``model.predict`` at each input
    (:func:`mmppma.deploy.mask_rcnn.compare_with_predict`)."""
    from mmppma.deploy import DetectionMismatch
    from mmppma.deploy.mask_rcnn import compare_with_predict
    for x in inputs:
        with checking(DetectionMismatch, 'torch eager failed'):  # model.predict or the heads in torch
            comparisons = compare_with_predict(out, model, x)
        print_detector_check(comparisons, x)
    print(f'wrote {out}')
    return 0


def print_detector_check(comparisons, x: torch.Tensor) -> None:
    """One line per image of :func:`check_detector`'s figures."""
    for b, c in enumerate(comparisons):
        print(f'onnxruntime (CPU) vs model.predict, image {b} of {tuple(x.shape)}: before NMS max relative '
              f'difference {max(c.rpn, c.roi):.3e} (RPN {c.rpn:.1e}, box head {c.roi:.1e}); {c.detections[0]} '
              f'detections (mmdet {c.detections[1]}), labels equal, boxes max relative difference '
              f'{max(c.boxes, c.proposals):.1e}, scores max difference {c.scores:.1e}, smallest mask IoU '
              f'{c.mask_iou:.4f} ({c.near_threshold} below 0.99, differing only within 1e-3 of the threshold); '
              f'smallest gap between mmdet\'s scores {c.score_gap:.1e}'
              + ('; equal RPN scores: against mmdet\'s RoI head on its proposals with the ties broken by index'
                 if c.ties else ''))


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        with warnings.catch_warnings():
            if not args.debug:  # the exporter's deprecation notes would bury the one line a failure prints
                warnings.simplefilter('ignore')
            return convert(args)
    except StepFailed as failure:
        error = failure.__cause__
        if args.debug and error is not None:
            traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
        hint = ' (--debug: the traceback)' if error is not None and not args.debug else ''
        print(f'pytorch2onnx: {args.config}: {failure}{hint}', file=sys.stderr)
        return EXIT_CODES[failure.step]


if __name__ == '__main__':
    sys.exit(main())
