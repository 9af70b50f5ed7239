"""The VMINet family: its spec (:mod:`.family`). Its timm models and the model index are the release revision
7c2632c's (``context_mask='tril', proj_norm=False``)."""
from . import vminet_release
from .family import FamilySpec, Variant, register_family
from .vminet import VMINet


def weight_options(conversion) -> dict:
    """The options of the release revision the keys show; for a state in mmppma's layout (no revision), the
    ``proj_norm`` its keys show (its context mask is not visible in the weights)."""
    release = conversion.info['release']
    if release is None:
        return dict(proj_norm=conversion.measured['proj_norm'])
    return {k: v for k, v in release.items() if k != 'revision'}


SPEC = register_family(FamilySpec(
    release=vminet_release,
    variants=(Variant('VMINet', VMINet, options=dict(vminet_release.RELEASE_REVISIONS['7c2632c']), metafile='vminet',
                      code='https://github.com/yws-wxs/VMINet',
                      no_weights='the VMINet release publishes no VMINet-B weights (its README says "retraining")'), ),
    sizes=dict(tiny='ti', xsmall='xs', small='s', base='b'),
    head='linear',
    stem='stem.0.conv',
    classifier_options=dict(out_norm='BN'),  # the release's final norm is norm3
    dense_options=dict(out_norm='LN'),
    weight_options=weight_options,
    revision_config='configs/vminet_{arch}_release-{revision}_in1k.py',
    record=vminet_release.RELEASE_RECORD,
))
