"""Model utilities: release checkpoint conversion, FLOP counting."""
from .checkpoint_convert import (CheckpointMismatchError, detect_mask, extract_state_dict, inspect_backbone,
                                 match_arch, mmppma_to_official, official_to_mmppma)
from .flops import attention_flop_jit, count_flops

__all__ = [
    'CheckpointMismatchError', 'detect_mask', 'extract_state_dict', 'inspect_backbone', 'match_arch',
    'mmppma_to_official', 'official_to_mmppma', 'attention_flop_jit', 'count_flops'
]
