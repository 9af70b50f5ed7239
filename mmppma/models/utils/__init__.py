"""Model utilities (checkpoint conversion)."""
from .checkpoint_convert import (CheckpointMismatchError, detect_arch, detect_mask, extract_state_dict,
                                 mmppma_to_official, official_to_mmppma)

__all__ = [
    'CheckpointMismatchError', 'detect_arch', 'detect_mask', 'extract_state_dict', 'mmppma_to_official',
    'official_to_mmppma'
]
