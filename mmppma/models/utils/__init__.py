"""Model utilities: release checkpoint conversion (also on load: release_loading; whole detectors and segmentors:
whole_model_convert), FLOP counting."""
from .checkpoint_convert import (
                                 FAMILIES,
    CheckpointMismatchError,
    detect_mask,
    extract_state_dict,
    match_arch,
    mmppma_to_release,
    release_to_mmppma,
)
from .flops import attention_flop_jit, count_flops

__all__ = [
    'FAMILIES', 'CheckpointMismatchError', 'detect_mask', 'extract_state_dict', 'match_arch', 'mmppma_to_release',
    'release_to_mmppma', 'attention_flop_jit', 'count_flops'
]
