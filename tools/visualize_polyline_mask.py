#!/usr/bin/env python
"""Draw a PPMA backbone's learned decay factors and its masked attention for one query (paper Figs. 7, 12).

    python tools/visualize_polyline_mask.py CONFIG CHECKPOINT IMAGE --out DIR
        [--stage S] [--block B] [--query I J] [--size PX] [--heads N]

CONFIG is any mmppma config (classification, detection or segmentation); its backbone is built and, unless
CHECKPOINT is ``none`` (random init), loaded from CHECKPOINT. The image is resized so its short side is
``--size`` (default 224). For block B of stage S (default: the first block of stage 2) it writes to DIR:

* ``decay_s{S}b{B}.png``: per head, alpha = exp(la) (horizontal) and beta = exp(lb) (vertical) on the
  stage's token grid (Fig. 7); RMT backbones have one fixed decay per head instead;
* ``attention_s{S}b{B}_q{I}_{J}.png``: per head, for the query token (I, J) of the stage's grid (default: the
  centre): softmax(q k^T) without a mask, the block's path mask (L2D = exp(M) + exp(M^T) for the polyline
  mask: the V2H path and its transpose, docs/method.md §2) and the block's actual attention weights over all keys
  (Fig. 12), all from the attention layer's ``query_maps``;
* ``maps_s{S}b{B}_q{I}_{J}.npz``: the arrays behind both figures.
"""
import argparse
import os
import os.path as osp
import sys
from typing import Dict, Tuple

# Runs as a script from a checkout: make the checkout's mmppma importable without installing it.
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='an mmppma config (classification, detection or segmentation)')
    parser.add_argument('checkpoint', help="checkpoint file, or 'none' for the random initialization")
    parser.add_argument('image', help='input image')
    parser.add_argument('--out', required=True, help='output folder for the PNGs')
    parser.add_argument('--stage', type=int, default=2, help='stage index (default 2)')
    parser.add_argument('--block', type=int, default=0, help='block index within the stage (default 0)')
    parser.add_argument('--query', type=int, nargs=2, metavar=('I', 'J'),
                        help="query token (row, column) on the stage's grid (default: the centre)")
    parser.add_argument('--size', type=int, default=224, help='short side of the resized image (default 224)')
    parser.add_argument('--heads', type=int, default=8, help='draw at most this many heads (default 8)')
    return parser.parse_args(argv)


def build_backbone(config: str, checkpoint: str) -> Tuple[torch.nn.Module, Tuple[tuple, tuple]]:
    """The config's backbone (eval mode, weights from ``checkpoint`` unless 'none') and its (mean, std)."""
    from mmppma.utils.configs import build_config_model, load_config
    cfg = load_config(config)
    model = build_config_model(cfg)
    if checkpoint.lower() != 'none':
        from mmengine.runner import load_checkpoint
        if not osp.isfile(checkpoint) and '://' not in checkpoint:
            raise SystemExit(f'checkpoint {checkpoint}: no such file (pass none for a random initialization)')
        load_checkpoint(model, checkpoint, map_location='cpu', revise_keys=[(r'^module\.', '')])
    backbone = getattr(model, 'backbone', model)
    if not hasattr(backbone, 'layers') or not hasattr(backbone, 'arch_settings'):
        raise SystemExit(f'{config}: the backbone is {type(backbone).__name__}, not an mmppma PPMA/RMT backbone')
    preprocessor = cfg.model.get('data_preprocessor', None) or cfg.get('data_preprocessor', None) or {}
    mean = tuple(preprocessor.get('mean', IMAGENET_MEAN))
    std = tuple(preprocessor.get('std', IMAGENET_STD))
    return backbone.eval(), (mean, std)


def load_image(path: str, size: int, mean, std) -> Tuple[np.ndarray, torch.Tensor]:
    """-> (RGB uint8 resized image, normalized (1, 3, H, W) tensor); short side ``size``, sides multiples of 32."""
    import cv2
    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        raise SystemExit(f'image {path}: cannot be read')
    h, w = bgr.shape[:2]
    scale = size / min(h, w)
    new_h, new_w = (max(32, int(round(v * scale / 32)) * 32) for v in (h, w))
    rgb = cv2.cvtColor(cv2.resize(bgr, (new_w, new_h), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
    x = (torch.from_numpy(rgb).float() - torch.tensor(mean)) / torch.tensor(std)
    return rgb, x.permute(2, 0, 1)[None]


def capture_attention_inputs(backbone, x: torch.Tensor, stage: int, block: int) -> Tuple[torch.nn.Module, Dict]:
    """Run the backbone once and return block (stage, block)'s attention module and what it attended with:
    its input tokens x and position tables pos (captured by a forward pre-hook), and its q, k."""
    num_stages = len(backbone.layers)
    if not 0 <= stage < num_stages:
        raise SystemExit(f'--stage {stage}: the backbone has stages 0..{num_stages - 1}')
    blocks = backbone.layers[stage].blocks
    if not 0 <= block < len(blocks):
        raise SystemExit(f'--block {block}: stage {stage} has blocks 0..{len(blocks) - 1}')
    attn = blocks[block].retention
    captured: Dict = {}

    def record(module, args):
        captured.update(x=args[0], pos=args[1])

    handle = attn.register_forward_pre_hook(record)
    try:
        with torch.no_grad():
            backbone(x)
            captured['q'], captured['k'] = attn.queries_keys(captured['x'], captured['pos'])
    finally:
        handle.remove()
    return attn, captured


def attention_maps(attn, captured: Dict, i: int, j: int) -> Dict[str, np.ndarray]:
    """The figures' arrays for query (i, j) of the first image: decay factors alpha, beta (heads, H, W) and
    :meth:`~mmppma.models.layers.attention.PolylinePathAttention.query_maps` (heads, H, W) each."""
    tokens, pos = captured['x'], captured['pos']
    with torch.no_grad():
        la, lb = attn.log_decays(tokens, pos)
        found = attn.query_maps(tokens, pos, [(i, j)])
    maps = {'alpha': la[0].exp().numpy(), 'beta': lb[0].exp().numpy()}
    for key, name in (('mask', 'mask'), ('attention', 'attention_masked'), ('unmasked', 'attention_unmasked')):
        maps[name] = found[key][0, :, 0].numpy()
    return maps


def draw(maps: Dict[str, np.ndarray], image: np.ndarray, query: Tuple[int, int], out_dir: str, tag: str,
         max_heads: int, title: str) -> Tuple[str, str]:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    heads = min(max_heads, maps['alpha'].shape[0])
    h, w = maps['alpha'].shape[1:]
    i, j = query

    fig, axes = plt.subplots(2, heads + 1, figsize=(2.2 * (heads + 1), 4.6), squeeze=False)
    for row, (key, name) in enumerate((('alpha', 'alpha (horizontal)'), ('beta', 'beta (vertical)'))):
        axes[row, 0].imshow(image)
        axes[row, 0].set_title(name, fontsize=9)
        for hd in range(heads):
            # each map on its own range: the spatial structure (object edges) lies in small differences
            values = maps[key][hd]
            axes[row, hd + 1].imshow(values, cmap='viridis')
            axes[row, hd + 1].set_title(f'head {hd}: {values.min():.3f}-{values.max():.3f}', fontsize=7)
    for ax in axes.flat:
        ax.axis('off')
    fig.suptitle(f'{title}: decay factors (each map on its own color range), {h}x{w} tokens', fontsize=10)
    decay_path = osp.join(out_dir, f'decay_{tag}.png')
    fig.savefig(decay_path, dpi=110)
    plt.close(fig)

    rows = (('attention_unmasked', 'softmax(q k^T)'), ('mask', 'path mask'),
            ('attention_masked', 'masked attention'))
    fig, axes = plt.subplots(len(rows), heads + 1, figsize=(2.2 * (heads + 1), 2.2 * len(rows) + 0.4), squeeze=False)
    ih, iw = image.shape[:2]
    for row, (key, name) in enumerate(rows):
        axes[row, 0].imshow(image)
        axes[row, 0].scatter([(j + 0.5) * iw / w], [(i + 0.5) * ih / h], c='red', s=30, marker='x')
        axes[row, 0].set_title(name, fontsize=9)
        for hd in range(heads):
            axes[row, hd + 1].imshow(maps[key][hd], cmap='magma')
            axes[row, hd + 1].scatter([j], [i], c='cyan', s=12, marker='x')
            axes[row, hd + 1].set_title(f'head {hd}', fontsize=8)
    for ax in axes.flat:
        ax.axis('off')
    fig.suptitle(f'{title}: query ({i}, {j}) of {h}x{w}', fontsize=10)
    attention_path = osp.join(out_dir, f'attention_{tag}_q{i}_{j}.png')
    fig.savefig(attention_path, dpi=110)
    plt.close(fig)
    return decay_path, attention_path


def main(argv=None) -> int:
    args = parse_args(argv)
    backbone, (mean, std) = build_backbone(args.config, args.checkpoint)
    image, x = load_image(args.image, args.size, mean, std)
    attn, captured = capture_attention_inputs(backbone, x, args.stage, args.block)
    h, w = captured['q'].shape[2:4]
    i, j = args.query if args.query is not None else (h // 2, w // 2)
    if not (0 <= i < h and 0 <= j < w):
        raise SystemExit(f'--query {i} {j}: stage {args.stage} has a {h}x{w} token grid at --size {args.size}; '
                         f'use 0 <= I < {h}, 0 <= J < {w}')
    maps = attention_maps(attn, captured, i, j)
    os.makedirs(args.out, exist_ok=True)
    tag = f's{args.stage}b{args.block}'
    weights = 'random init' if args.checkpoint.lower() == 'none' else 'trained'
    title = (f'{type(backbone).__name__} stage {args.stage} block {args.block} ({attn.attn_type}, '
             f'mask={attn.mask}, form={attn.form}, {weights})')
    paths = draw(maps, image, (i, j), args.out, tag, args.heads, title)
    npz = osp.join(args.out, f'maps_{tag}_q{i}_{j}.npz')
    np.savez_compressed(npz, query=np.array([i, j]), **maps)
    for path in (*paths, npz):
        print(path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
