"""mmppma: Polyline Path Masked Attention for OpenMMLab 2.0.

``import mmppma`` (or ``custom_imports=dict(imports=['mmppma'])`` in a config, or any ``type='mmppma.X'``,
which imports it on demand) registers mmppma's models for mmpretrain, mmdet and mmseg configs and lets
``torch.load(weights_only=True)`` read full mmengine checkpoints (see :mod:`mmppma.utils.checkpoint`).
Release checkpoints are converted where they are loaded (:mod:`mmppma.models.backbones.release_format`) and the
release models are registered with mmpretrain's ModelHub (:mod:`mmppma.utils.model_zoo`) and, every size, with timm
(:mod:`mmppma.timm_models`: ``timm.create_model('ppma_tiny', pretrained=True)``). It imports timm, and none of the
OpenMMLab downstream libraries (mmpretrain, mmdet, mmseg).
"""
import importlib.util

from .utils.checkpoint import allow_mmengine_checkpoint_globals
from .version import __version__

allow_mmengine_checkpoint_globals()

from . import engine, models  # noqa: E402,F401  (registers mmppma's classes)
from .models.backbones.release_format import register_release_loading  # noqa: E402
from .utils.model_zoo import register_with_mmpretrain  # noqa: E402

register_release_loading()
register_with_mmpretrain()

if importlib.util.find_spec('timm') is not None:  # timm is pinned (requirements.txt); registers the models there
    from . import timm_models  # noqa: E402,F401

__all__ = ['__version__']
