"""Kept so that the old import path names the new ones."""
raise ImportError('mmppma.models.utils is split: release checkpoint conversion is mmppma.models.conversion '
                  '(release_to_mmppma, mmppma_to_release, checkpoint_convert, whole_model_convert; FAMILIES is '
                  'RELEASE_FAMILIES) and FLOP counting is mmppma.models.flops (count_flops)')
