"""The MLLA family (MLLA and PPMLA, its attention times the polyline path mask): its spec (:mod:`.family`)."""
from . import mlla_release
from .family import FamilySpec, Variant, register_family
from .mlla import MLLA

SPEC = register_family(FamilySpec(
    release=mlla_release,
    variants=(
        Variant('MLLA', MLLA, metafile='mlla', paper='arXiv:2405.16605', code='https://github.com/LeapLabTHU/MLLA',
                op='ppma_linear_attention'),
        Variant('PPMLA', MLLA, options=dict(mask='polyline'), paper='arXiv:2506.15940',
                code='https://github.com/zhongchenzhao/PPMA',
                no_weights='no PPMLA weights are published (the PPMA release has none)', op='ppma_linear_attention',
                kernels='linear', baseline='MLLA'),
    ),
    sizes=dict(tiny='t', small='s', base='b'),
    head='linear',
    stem='patch_embed.conv1.conv',
    classifier_options=dict(out_norm=True),  # the release's final norm is norm3
    dense_options=dict(out_norm=True),
    # the kernel tools' labels of PPMLA's stages (MLLA, mask='none', launches no kernel)
    kernel_models=dict(mlla_t=('PPMLA', 'tiny'), mlla_b=('PPMLA', 'base')),
))
