#!/usr/bin/env python
"""PPMA vs RMT (and PPMLA, MLLA: every variant of a registered family whose attention takes an ``impl``,
``Variant.op``): training-step (or inference) time and peak memory, eager or compiled, every model, impl and
compile mode in one run.

    python tools/benchmark_model.py [--arch tiny] [--shape 512 768] [--batch 1] [--iters 3] [--device cpu]
                                    [--impl auto [torch reference ...]] [--models PPMA RMT [PPMLA MLLA]]
                                    [--task backbone|classifier|mask_rcnn] [--mode train|infer] [--amp fp16|bf16]
                                    [--compile none [default reduce-overhead]] [--optimizer]
                                    [--rounds 1] [--profile] [--release-dir DIR]

The inference table of docs/benchmarks.md (PPMA-T and RMT-T against the release's models)::

    PYTHONPATH=<timm and einops> python tools/benchmark_model.py --mode infer --task classifier \\
        --shape 224 224 --batch 8 --rounds 3 --release-dir <folder with the release's PPMA.py and RMT.py>

``--models``: PPMA, RMT, PPMLA (MLLA with ``mask='polyline'``) and MLLA, each from its config where the task
has one (``configs/{ppma,rmt,ppmla,mlla}_t_*``; PPMLA only in tiny). The summary gives each model against its
baseline (``Variant.baseline``: PPMA / RMT, PPMLA / MLLA) where both ran.

``--compile`` takes one or more of ``none`` (eager), ``default`` (``torch.compile(step)``, as mmengine's
``compile=True``) and ``reduce-overhead`` (``torch.compile(step, mode='reduce-overhead')``: inductor and, on a
GPU, CUDA graphs; on a CPU it runs as ``default``); every model and impl runs once per mode. Compiled, the
step's forward and loss are what is compiled (the backward follows from it), and the warm-up is three steps
instead of one: the first compiles, the second records the CUDA graphs, the third replays them; the table
gives the first step's time (``compile (s)``: trace, compile and run). ``--optimizer`` adds an AdamW step
(lr 1e-3, weight decay 0.05) to the training step, outside what is compiled, as mmengine runs it.

``--task backbone`` (default) times the backbone alone (out_indices 0-3, release dense layout; the loss is the
sum of its outputs). ``--task classifier`` times the classification trunk of our ImageNet configs
(``configs/{ppma,rmt}_{t,s,b}_8xb128_in1k.py``: the backbone's last stage and the head up to the pooled
features; the loss is their sum). ``--task mask_rcnn`` times a whole Mask R-CNN training step from our configs
(``configs/mask_rcnn_{ppma,rmt}_{t,s,b}_1x_coco.py``, no pretrained weights): data preprocessor, backbone,
FPN, RPN and RoI heads with their losses, on a synthetic batch (random images, three boxes with masks each).

``--impl`` takes one or more attention implementations; every model runs once per impl, and the summary
gives each model against its baseline per impl and, when ``reference`` is among them, each model's impls against
its ``reference`` path (for PPMA the #5 targets: time ratio and peak-memory share).

``--mode infer`` times inference (``eval()``, ``torch.inference_mode``) instead of a training step and
prints images per second as well; ``--amp`` runs under ``torch.autocast`` with that dtype (CUDA for fp16),
and in inference also prints the error of the outputs against a float32 forward on the same input.

``--clock cpu`` times the steps by the process's CPU time instead of the wall clock (for a loaded machine,
with ``OMP_NUM_THREADS=1``). ``--rounds R`` measures every run R times, the runs alternating within each
round (a load change then hits every model alike); the table gives each run's best round and lists the
rounds. ``--profile`` adds each
run's per-op profile (``torch.profiler`` over two steps, top ops by self CPU time) from the last round.

``--release-dir DIR`` also times the official release's models (``zhongchenzhao/PPMA``,
``classification/models/{PPMA,RMT}.py`` placed in DIR, not part of this project; they import timm and
einops; the variants with a ``Variant.release_model``) through their ``forward_features`` (the classification
trunk up to the pooled features, the work of ``--task classifier``, which it requires), and prints ours against
theirs.

Each (model, impl) runs in its own fresh subprocess, one after the other, so that none sees another's
allocations or caches. Per run: build the model, make the input, then run the step ``1 + iters`` times.

* time: median wall time of the ``iters`` runs after the warm-up (which includes one-off costs).
* peak memory on CPU: the increase of the process's peak resident set size (``getrusage(RUSAGE_SELF)
  .ru_maxrss``) from just before the first step to just after the warm-up (compiled: compilation included).
  This is the extra resident memory the step needed (activations, saved tensors, gradients, temporaries) on
  top of the model and input; allocator reuse can only make it smaller than the sum of all allocations, never
  larger. On CUDA:
  ``torch.cuda.max_memory_allocated`` over the same steps, minus the memory allocated before them (with CUDA
  graphs: their memory pool included).
"""
import argparse
import json
import os
import os.path as osp
import resource
import statistics
import subprocess
import sys
import time

IMPLS = ['auto', 'torch', 'triton', 'reference']
#: --compile -> torch.compile's mode (None: eager)
COMPILE_MODES = {'none': None, 'default': 'default', 'reduce-overhead': 'reduce-overhead'}
ROOT = osp.join(osp.dirname(osp.abspath(__file__)), '..')
RELEASE = 'release'  # the impl column of the release's models
sys.path.insert(0, ROOT)  # run from a checkout

from mmppma.models.backbones.family import variant_of, variants  # noqa: E402

#: the models: the variants whose attention takes an impl, by name
VARIANTS = {v.name: v for v in variants() if v.op}
#: the release's models, + T | S | B, in the release's <name>.py
RELEASE_FACTORIES = {name: v.release_model for name, v in VARIANTS.items() if v.release_model}


def config(variant: str, arch: str, template: str = '{variant}_{arch}_8xb128_in1k.py') -> str:
    """A repository config of the variant and arch: configs/<template> with its key and the config arch name."""
    v = variant_of(variant)
    return osp.join(ROOT, 'configs', template.format(variant=v.key, arch=v.family.config_arch(arch)))


def build_backbone(args, device):
    """The backbone alone; the step's loss is the sum of its four outputs."""
    import torch

    model = VARIANTS[args.worker].build(args.arch, impl=args.impl).to(device)
    x = torch.randn(args.batch, 3, *args.shape, device=device)

    def loss(train: bool):
        outs = model(x)
        return sum(o.float().sum() for o in outs) if train else outs

    return model, x, loss


def build_classifier(args, device):
    """The classification trunk of our ImageNet config (``configs/{ppma,rmt,mlla,ppmla}_*_8xb128_in1k.py``), the
    work of the release's ``forward_features``: for PPMA and RMT the backbone (last stage only, no output norm) and
    the head's pre-logits (projection, BatchNorm, Swish, average pool); for MLLA and PPMLA the backbone (normed last
    stage) and the average pool. The step's loss is the sum of the pooled features."""
    import torch
    from mmengine.config import Config

    import mmppma  # noqa: F401  (registers the backbones and the head)
    from mmppma.registry import MODELS
    path = config(args.worker, args.arch)
    cfg = Config.fromfile(path).model
    backbone = MODELS.build(dict(cfg.backbone, impl=args.impl))
    if cfg.get('neck') is not None:
        # MLLA's and PPMLA's configs: the backbone's normed last stage, mmpretrain's GlobalAveragePooling and a
        # LinearClsHead, whose pre-logits are its input: the trunk is the backbone and the pooling
        if cfg.neck.type != 'GlobalAveragePooling' or cfg.head.type != 'LinearClsHead':
            raise ValueError(f'{path}: the classifier trunk knows a GlobalAveragePooling neck with a LinearClsHead, '
                             f'not {cfg.neck.type} with {cfg.head.type}')
        head = None
        model = torch.nn.ModuleDict(dict(backbone=backbone)).to(device)
    else:
        head = MODELS.build(dict(cfg.head, loss=torch.nn.Identity()))  # the loss is not run here
        model = torch.nn.ModuleDict(dict(backbone=backbone, head=head)).to(device)
    x = torch.randn(args.batch, 3, *args.shape, device=device)

    def loss(train: bool):
        feats = backbone(x)[-1].mean((-2, -1)) if head is None else head.pre_logits(backbone(x))
        return feats.float().sum() if train else feats

    return model, x, loss


def build_release(args, device):
    """The release's classification model from ``args.release_dir`` (its own file, imported as is), timed
    through ``forward_features``."""
    import importlib

    import torch
    sys.path.insert(0, osp.abspath(args.release_dir))
    factory = RELEASE_FACTORIES[args.worker] + args.arch[0].upper()
    model = getattr(importlib.import_module(args.worker), factory)(None).to(device)
    x = torch.randn(args.batch, 3, *args.shape, device=device)

    def loss(train: bool):
        return model.forward_features(x).float().sum() if train else model.forward_features(x)

    return model, x, loss


def build_mask_rcnn(args, device):
    """Mask R-CNN from our 1x config for the model and arch, on a synthetic batch of ``args.batch`` images of
    ``args.shape`` with three boxes (and box-shaped masks) each; the step's loss is the detector's."""
    import numpy as np
    import torch
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope
    from mmengine.structures import InstanceData

    import mmppma  # noqa: F401  (registers the backbones)
    register_all_modules(init_default_scope=False)
    init_default_scope('mmdet')
    path = config(args.worker, args.arch, 'mask_rcnn_{variant}_{arch}_1x_coco.py')
    cfg = Config.fromfile(path)
    cfg.model.backbone.update(impl=args.impl, init_cfg=None)
    model = MODELS.build(cfg.model).to(device)
    h, w = args.shape
    gen = np.random.default_rng(0)
    images, samples = [], []
    for _ in range(args.batch):
        images.append(torch.from_numpy(gen.integers(0, 256, (3, h, w), dtype=np.uint8)).to(device))
        boxes, masks = [], np.zeros((3, h, w), dtype=np.uint8)
        for j in range(3):
            x0, y0 = gen.integers(0, w // 2), gen.integers(0, h // 2)
            x1, y1 = x0 + gen.integers(w // 8 + 1, w // 2), y0 + gen.integers(h // 8 + 1, h // 2)
            boxes.append([x0, y0, x1, y1])
            masks[j, y0:y1, x0:x1] = 1
        sample = DetDataSample(metainfo=dict(img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor(boxes, dtype=torch.float32, device=device),
            labels=torch.tensor([1, 2, 3], device=device),
            masks=BitmapMasks(masks, h, w))
        samples.append(sample)
    data = model.data_preprocessor(dict(inputs=images, data_samples=samples), training=True)

    def loss(train: bool):
        if train:
            losses = model(data['inputs'], data['data_samples'], mode='loss')
            return model.parse_losses(losses)[0]
        model(data['inputs'], data['data_samples'], mode='predict')
        return None

    return model, data['inputs'], loss


def worker(args: argparse.Namespace) -> dict:
    import torch
    torch.manual_seed(0)
    device = torch.device(args.device)
    train = args.mode == 'train'
    builds = {'backbone': build_backbone, 'classifier': build_classifier, 'mask_rcnn': build_mask_rcnn}
    build = build_release if args.impl == RELEASE else builds[args.task]
    model, x, loss = build(args, device)
    model.train(train)
    amp_dtype = {None: None, 'fp16': torch.float16, 'bf16': torch.bfloat16}[args.amp]
    mode = COMPILE_MODES[args.worker_compile]
    run = loss if mode is None else torch.compile(loss, mode=mode)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05) if args.optimizer else None

    def step():
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            if train:
                run(True).backward()
                if optimizer is not None:
                    optimizer.step()
                model.zero_grad(set_to_none=True)
            else:
                with torch.inference_mode():
                    run(False)
        if device.type == 'cuda':
            torch.cuda.synchronize()

    clock = {'wall': time.perf_counter, 'cpu': time.process_time}[args.clock]
    warmup = 1 if mode is None else 3  # compiled: compile, record the CUDA graphs, replay them

    def warm_up():
        start = clock()
        step()
        first = clock() - start
        for _ in range(warmup - 1):
            step()
        return first

    if device.type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        first = warm_up()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        first = warm_up()
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
    times = []
    for _ in range(args.iters):
        start = clock()
        step()
        times.append(clock() - start)
    profile = op_profile(step) if args.profile else ''
    amp_error = None
    if amp_dtype is not None and not train and args.task != 'mask_rcnn':
        amp_error = amp_errors(model, run, amp_dtype)
    common = dict(model=args.worker, compile=args.worker_compile, first_s=first, time_s=statistics.median(times),
                  times_s=times, peak_bytes=peak, profile=profile, amp_error=amp_error,
                  threads=torch.get_num_threads(), torch=torch.__version__, device=device_name(device))
    if args.impl == RELEASE:
        return dict(common, impl=RELEASE, resolved=RELEASE, stage_s=[])
    backbone = model if args.task == 'backbone' else model.backbone
    # the stages of a backbone whose stages differ in attention (its arch's attn_types)
    stages = stage_times(backbone, x, device, max(1, args.iters)) if (
        train and args.stages and mode is None and 'attn_types' in backbone.arch_settings) else []
    from mmppma.ops.plan import resolve_impl
    resolved = resolve_impl(args.impl, VARIANTS[args.worker].op, [torch.empty(0, device=device)])
    return dict(common, impl=args.impl, resolved=resolved, stage_s=stages)


def amp_errors(model, infer, amp_dtype=None) -> list:
    """[max |amp - fp32|, ||amp - fp32|| / ||fp32||] over the inference outputs, both runs on the same input."""
    import torch
    with torch.inference_mode():
        with torch.autocast(next(model.parameters()).device.type, dtype=amp_dtype):
            low = infer(False)
        full = infer(False)
    pairs = list(zip(*(o if isinstance(o, (tuple, list)) else (o, ) for o in (low, full))))
    return [max((a.float() - b).abs().max().item() for a, b in pairs),
            max(((a.float() - b).norm() / b.norm()).item() for a, b in pairs)]


def device_name(device) -> str:
    import torch
    return torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'


def op_profile(step, rows: int = 15) -> str:
    """``torch.profiler`` table of two steps: the ``rows`` ops with the most self time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
        step()
    return prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=rows, max_name_column_width=40)


def stage_times(model, x, device, iters: int) -> list:
    """Forward+backward time of each stage alone on its real input (min of ``iters`` runs), to show where
    the time goes. Stage i's input is the previous stages' output computed without gradients."""
    import torch
    with torch.no_grad():
        h = getattr(model, model.stem_name)(x)
    result = []
    for layer in getattr(model, model.stages_name):
        inp = h.detach().requires_grad_()
        runs = []
        for _ in range(iters):
            start = time.perf_counter()
            out, _ = layer(inp)
            out.float().sum().backward()
            if device.type == 'cuda':
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - start)
        result.append(min(runs))
        with torch.no_grad():
            h = layer(inp)[1]
    model.zero_grad(set_to_none=True)
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    archs = sorted({name for v in VARIANTS.values() for name in v.backbone.arch_zoo})
    parser.add_argument('--arch', default='tiny', choices=archs)
    parser.add_argument('--shape', type=int, nargs=2, default=[512, 768], metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--iters', type=int, default=3, help='timed runs after the first')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--impl', '--impls', dest='impl', nargs='+', default=['auto'], choices=IMPLS,
                        help='attention implementation(s) passed to the ops; each model runs once per impl')
    parser.add_argument('--models', nargs='+', default=['PPMA', 'RMT'], choices=list(VARIANTS),
                        help="the backbones; PPMLA is MLLA with mask='polyline'")
    parser.add_argument('--task', default='backbone', choices=['backbone', 'classifier', 'mask_rcnn'],
                        help='time the backbone alone, the classification trunk (configs/*_8xb128_in1k.py: '
                        'backbone and head up to the pooled features) or a whole Mask R-CNN step '
                        '(configs/mask_rcnn_*_1x_coco.py)')
    parser.add_argument('--mode', default='train', choices=['train', 'infer'],
                        help='time a training step (forward + backward) or inference')
    parser.add_argument('--amp', choices=['fp16', 'bf16'], help='run under torch.autocast with this dtype')
    parser.add_argument('--compile', nargs='+', default=['none'], choices=list(COMPILE_MODES),
                        help='eager (none) and / or torch.compile modes; every model and impl runs once per mode')
    parser.add_argument('--optimizer', action='store_true',
                        help='add an AdamW step to the training step (forward, backward, optimizer)')
    parser.add_argument('--no-stages', dest='stages', action='store_false',
                        help='skip the per-stage breakdown of the backbone (those whose stages differ in attention, '
                        'PPMA and RMT; eager train mode)')
    parser.add_argument('--rounds', type=int, default=1,
                        help='measure every run this many times, alternating the runs; report the best round')
    parser.add_argument('--profile', action='store_true', help="print each run's per-op profile (last round)")
    parser.add_argument('--clock', choices=['wall', 'cpu'], default='wall',
                        help='time the steps by wall clock, or by the CPU time of the process (all its threads; '
                        'with OMP_NUM_THREADS=1 a measure that other jobs on the machine barely disturb)')
    parser.add_argument('--release-dir', metavar='DIR',
                        help="also time the release's models from DIR/PPMA.py and DIR/RMT.py (with --task classifier)")
    parser.add_argument('--worker', choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument('--worker-impl', choices=IMPLS + [RELEASE], help=argparse.SUPPRESS)
    parser.add_argument('--worker-compile', choices=list(COMPILE_MODES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.impl = args.worker_impl
        return args
    for name, values in (('--impl', args.impl), ('--models', args.models), ('--compile', args.compile)):
        if len(set(values)) != len(values):
            parser.error(f'{name} lists a value twice: {values}')
    if args.optimizer and args.mode != 'train':
        parser.error('--optimizer adds an AdamW step to the training step: use it with --mode train')
    if args.rounds < 1:
        parser.error(f'--rounds must be at least 1; got {args.rounds}')
    if args.release_dir:
        if args.task != 'classifier':
            parser.error("--release-dir times the release's forward_features against our classification trunk: "
                         'use it with --task classifier')
        released = [name for name in args.models if name in RELEASE_FACTORIES]
        if not released:
            parser.error(f"--release-dir times the release's {' and '.join(RELEASE_FACTORIES)}: name one of them in "
                         '--models')
        missing = [f'{name}.py' for name in released if not osp.isfile(osp.join(args.release_dir, f'{name}.py'))]
        if missing:
            parser.error(f'--release-dir {args.release_dir}: no {", ".join(missing)} there; put the release\'s '
                         f'classification/models/{" and ".join(f"{n}.py" for n in RELEASE_FACTORIES)} in it')
    return args


def run_worker(args: argparse.Namespace, name: str, impl: str, mode: str, profile: bool = False) -> dict:
    cmd = [sys.executable, osp.abspath(__file__), '--worker', name, '--worker-impl', impl, '--worker-compile', mode,
           '--arch', args.arch,
           '--shape', *map(str, args.shape), '--batch', str(args.batch), '--iters', str(args.iters),
           '--device', args.device, '--task', args.task, '--mode', args.mode]
    cmd += (['--amp', args.amp] if args.amp else []) + ([] if args.stages else ['--no-stages'])
    cmd += ['--clock', args.clock] + (['--profile'] if profile else []) + (['--optimizer'] if args.optimizer else [])
    cmd += ['--release-dir', args.release_dir] if impl == RELEASE else []
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if out.returncode:
        sys.stderr.write(out.stderr)
        print(f'FAIL: {name} ({label(impl, mode)}) benchmark failed (exit {out.returncode}); the other runs go on',
              file=sys.stderr, flush=True)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def label(impl: str, mode: str) -> str:
    """``impl=auto`` for an eager run, ``impl=auto compile=default`` for a compiled one: how the summary names a run."""
    return f'impl={impl}' + ('' if mode == 'none' else f' compile={mode}')


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    runs = [(name, impl, mode) for mode in args.compile for impl in args.impl for name in args.models]
    runs += [(name, RELEASE, mode) for mode in args.compile for name in args.models
             if args.release_dir and name in RELEASE_FACTORIES]
    rounds = {run: [] for run in runs}
    for r in range(args.rounds):
        for name, impl, mode in runs:
            res = run_worker(args, name, impl, mode, profile=args.profile and r == args.rounds - 1)  # a profile is slow
            if res is None:
                continue
            rounds[name, impl, mode].append(res)
            print(f'round {r + 1}: {name} {label(impl, mode)}: {res["time_s"]:.3f} s, '
                  f'{res["peak_bytes"] / 2**20:.1f} MiB', flush=True)
    # each run's best round; its peak memory is the largest of all rounds
    failed = [run for run, rs in rounds.items() if not rs]
    rounds = {run: rs for run, rs in rounds.items() if rs}
    if not rounds:
        raise SystemExit('benchmark_model: every run failed (their errors are above)')
    results = {run: dict(min(rs, key=lambda res: res['time_s']), peak_bytes=max(res['peak_bytes'] for res in rs))
               for run, rs in rounds.items()}
    first = next(iter(results.values()))
    h, w = args.shape
    what = ('training step' + (' with AdamW' if args.optimizer else '')) if args.mode == 'train' else 'inference'
    print(f'\n{args.task} ({args.arch}), input {args.batch}x3x{h}x{w}, {what}, device {first["device"]}, '
          f'{first["threads"]} threads, torch {first["torch"]}, amp={args.amp or "off"}, '
          f'{args.clock} clock, best of {args.rounds} round(s)')
    print(f'{"model":6s} {"impl":14s} {"compile":16s} {"median time (ms)":>16s} {"images/s":>10s} '
          f'{"peak memory (MiB)":>18s} {"first step (s)":>14s}')
    for (name, impl, mode), res in results.items():
        shown = impl if res['resolved'] == impl else f'{impl}->{res["resolved"]}'
        print(f'{name:6s} {shown:14s} {mode:16s} {1000 * res["time_s"]:16.3f} {args.batch / res["time_s"]:10.1f} '
              f'{res["peak_bytes"] / 2**20:18.1f} {res["first_s"]:14.2f}')
        if res['amp_error'] is not None:
            print(f'    {args.amp} outputs against float32: max abs error {res["amp_error"][0]:.3g}, '
                  f'relative (norm) error {res["amp_error"][1]:.3g}')
        if args.rounds > 1:
            print('    rounds, images/s: ' + ' / '.join(f'{args.batch / r["time_s"]:.1f}'
                                                       for r in rounds[name, impl, mode]))
        for i, t in enumerate(res['stage_s']):
            print(f'    stage {i + 1}: {t:.3f} s (fwd+bwd of the stage alone)')

    def ratio(a, b, what='time'):
        """``time 1.20x, peak memory 0.90x`` of run a against run b (``what='images/s'``: b's time over a's)."""
        p, q = results[a], results[b]
        speed = q['time_s'] / p['time_s'] if what == 'images/s' else p['time_s'] / q['time_s']
        return f'{what} {speed:.2f}x, peak memory {p["peak_bytes"] / max(q["peak_bytes"], 1):.2f}x'

    for mode in args.compile:
        for impl in args.impl:
            for name in args.models:
                base = VARIANTS[name].baseline
                if (name, impl, mode) in results and (base, impl, mode) in results:
                    print(f'{name} / {base}, {label(impl, mode).replace(" ", ", ")}: '
                          f'{ratio((name, impl, mode), (base, impl, mode))}')
        for name in args.models:
            for impl in args.impl if (name, 'reference', mode) in results else ():
                if impl != 'reference' and (name, impl, mode) in results:
                    print(f'{name} {label(impl, mode)} / impl=reference: '
                          f'{ratio((name, impl, mode), (name, "reference", mode))}')
        for impl in args.impl:
            for name in args.models:
                for theirs in RELEASE_FACTORIES if args.release_dir else ():
                    if (name, impl, mode) in results and (theirs, RELEASE, mode) in results:
                        print(f'{name} {label(impl, mode)} / release {theirs}: '
                              f'{ratio((name, impl, mode), (theirs, RELEASE, mode), "images/s")}')
    for mode in args.compile[1:] if args.compile[0] == 'none' else ():
        for name, impl in dict.fromkeys((name, impl) for name, impl, _ in results):
            if (name, impl, mode) in results and (name, impl, 'none') in results:
                print(f'{name} impl={impl}: compile={mode} / eager: '
                      f'{ratio((name, impl, mode), (name, impl, "none"), "images/s")}')
    for (name, impl, mode), rs in rounds.items() if args.profile else ():
        print(f'\nper-op profile, {name} {label(impl, mode)} (two steps, last round):\n{rs[-1]["profile"]}')
    if failed:
        print('FAILED runs (no row above): ' + ', '.join(f'{name} {label(impl, mode)}' for name, impl, mode in failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
