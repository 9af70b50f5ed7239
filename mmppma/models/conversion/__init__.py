"""Release checkpoints converted and checked against models: :mod:`.checkpoint_convert` (backbones and
classifiers, the converter behind tools/model_converters/release_to_mmppma.py) and :mod:`.whole_model_convert`
(whole detectors and segmentors). The families' key maps are beside the backbones."""
from .checkpoint_convert import (
    CheckpointMismatchError,
    extract_state_dict,
    match_arch,
    mmppma_to_release,
    release_to_mmppma,
)

__all__ = [
    'CheckpointMismatchError', 'extract_state_dict', 'match_arch', 'mmppma_to_release',
    'release_to_mmppma'
]
