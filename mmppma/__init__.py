"""mmppma: Polyline Path Masked Attention for OpenMMLab 2.0.

``import mmppma`` (or ``custom_imports=dict(imports=['mmppma'])`` in a config, or any ``type='mmppma.X'``,
which imports it on demand) registers mmppma's models for mmpretrain, mmdet and mmseg configs and lets
``torch.load(weights_only=True)`` read full mmengine checkpoints (see :mod:`mmppma.utils.checkpoint`).
It imports none of the downstream libraries.
"""
from .utils.checkpoint import allow_mmengine_checkpoint_globals
from .version import __version__

allow_mmengine_checkpoint_globals()

from . import engine, models  # noqa: E402,F401  (registers mmppma's classes)

__all__ = ['__version__']
