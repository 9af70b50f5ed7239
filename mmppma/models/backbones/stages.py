"""The attention stages of the shipped backbones at the shipped configs' input sizes, read from the arch tables:
the shapes the kernel tools check and time (tools/check_kernels.py, tools/gpu_check.py). The models and the op kind
of each stage's attention are the family specs' (``FamilySpec.kernel_models``, ``Variant.kernels``; 'linear': PPMLA's
polyline-masked linear attention, the decay-scan kernel)."""
from typing import Dict, List, Optional, Sequence, Tuple

from .family import FAMILIES, variant_of

#: label -> (variant name, arch name of its table), of every registered family
SHIPPED = {label: model for spec in FAMILIES.values() for label, model in spec.kernel_models.items()}
#: the stride of each stage's token grid
STRIDES = (4, 8, 16, 32)
#: input sizes (H, W) of the shipped configs, padded to a multiple of 32 as their data pipelines do, and the images
#: per GPU they batch
IMAGES: Dict[str, Tuple[Tuple[int, int], int]] = {
    'cls_224': ((224, 224), 64),
    'det_800x1344': ((800, 1344), 2),  # Mask R-CNN 1333 x 800, landscape
    'det_1344x800': ((1344, 800), 2),  # portrait
    'upernet_512': ((512, 512), 2),
    'cityscapes_1024x2048': ((1024, 2048), 1),
}


def attention_stages(label: str) -> Tuple[Tuple[str, ...], Tuple[int, ...], Tuple[int, ...]]:
    """(op kind per stage, heads per stage, head dims per stage) of a :data:`SHIPPED` backbone, from its arch
    table."""
    name, arch = SHIPPED[label]
    variant = variant_of(name)
    settings = variant.backbone.arch_zoo[arch]
    heads = tuple(settings['num_heads'])
    dims = tuple(e // h for e, h in zip(settings['embed_dims'], heads))
    return variant.stage_kinds(arch), heads, dims


def model_shapes(images: Sequence[str], models: Sequence[str],
                 batch: Optional[int] = None) -> List[Tuple[str, str, tuple]]:
    """(label, attention, (B, heads, H, W, d)) for every attention stage, duplicates removed; ``batch``: instead
    of the configs' images per GPU."""
    seen, shapes = set(), []
    for image in images:
        (h, w), per_gpu = IMAGES[image]
        batch_ = batch or per_gpu
        for model in models:
            for stage, (kind, nh, d) in enumerate(zip(*attention_stages(model))):
                key = (kind, batch_, nh, h // STRIDES[stage], w // STRIDES[stage], d)
                if key not in seen:
                    seen.add(key)
                    shapes.append((f'{image}{f"@{batch}" if batch else ""}/{model}/stage{stage + 1}', kind,
                                   key[1:]))
    return shapes
