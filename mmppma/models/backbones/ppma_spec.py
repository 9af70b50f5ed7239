"""The PPMA family (PPMA and its RMT baseline, one release layout): its spec (:mod:`.family`)."""
from . import ppma_release
from .family import FamilySpec, Variant, register_family
from .ppma import PPMA, RMT

PAPER, CODE = 'arXiv:2506.15940', 'https://github.com/zhongchenzhao/PPMA'


def weight_options(conversion) -> dict:
    """The learned mask the decays' shapes show (RMT: none, its mask is fixed)."""
    return {} if conversion.measured['variant'] == 'RMT' else dict(mask=conversion.measured['mask'])


SPEC = register_family(FamilySpec(
    release=ppma_release,
    variants=(
        Variant('PPMA', PPMA, metafile='ppma', paper=PAPER, code=CODE, op='ppma_attention',
                kernels=dict(criss_cross='cc', whole='whole'), release_model='PPMAViT_', baseline='RMT'),
        Variant('RMT', RMT, metafile='rmt', paper='arXiv:2309.11523', code='https://github.com/qhfan/RMT',
                no_weights='the RMT release (github.com/qhfan/RMT) links its ImageNet weights only as a Baidu '
                'Netdisk share, and the PPMA release publishes no RMT file: there is no direct download',
                op='ppma_attention', kernels=dict(criss_cross='rmt_cc', whole='manhattan'), release_model='RMT_'),
    ),
    sizes=dict(tiny='t', small='s', base='b'),
    head='ppma',
    stem='patch_embed.proj.0',
    classifier_options=dict(out_norm=False),
    dense_options=dict(out_norm=True),
    weight_options=weight_options,
    # the configs are for the polyline mask (and RMT's); the shared and no-mask ablations have none
    has_config=lambda info: info['mask'] in ('polyline', 'rmt'),
    custom_arch='attn_types',  # the attention type per stage is not visible in the weights
    kernel_models={f'{key}_{arch[0]}': (name, arch) for name, key in (('PPMA', 'ppma'), ('RMT', 'rmt'))
                   for arch in ('tiny', 'small', 'base')},
))
