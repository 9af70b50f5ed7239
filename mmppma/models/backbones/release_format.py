"""Kept so that the old import path names the new one."""
raise ImportError('mmppma.models.backbones.release_format is now mmppma.models.backbones.release: its '
                  'release_format(backbone) is family_format(backbone), and convert_release_state is replaced by '
                  'convert_and_check (convert, check against the target, log)')
