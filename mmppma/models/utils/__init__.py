"""Model utilities: release checkpoint conversion, checked against models (checkpoint_convert; whole detectors and
segmentors: whole_model_convert; the families' key maps are beside the backbones), FLOP counting."""
from .checkpoint_convert import (
    FAMILIES,
    CheckpointMismatchError,
    extract_state_dict,
    match_arch,
    mmppma_to_release,
    release_to_mmppma,
)
from .flops import attention_flop_jit, count_flops

__all__ = [
    'FAMILIES', 'CheckpointMismatchError', 'extract_state_dict', 'match_arch', 'mmppma_to_release',
    'release_to_mmppma', 'attention_flop_jit', 'count_flops'
]
