"""mmppma: Polyline Path Masked Attention for OpenMMLab 2.0.

``import mmppma`` (or ``custom_imports=dict(imports=['mmppma'])`` in a config, or any ``type='mmppma.X'``, which
imports it on demand) registers mmppma's classes: the models and optimizer wrappers with the mmengine registries
(so mmpretrain, mmdet and mmseg configs build them), the release models' index with mmpretrain's ``ModelHub``
(:mod:`mmppma.utils.model_zoo`) and every size with timm (:mod:`mmppma.timm_models`). It imports timm, and none
of the OpenMMLab downstream libraries (mmpretrain, mmdet, mmseg), nor the runner set-up of tools/train.py.

Besides registering, it installs, each once per process:

* the weights_only allowlist of mmengine checkpoints (:mod:`mmppma.utils.checkpoint`): torch >= 2.6 loads with
  ``weights_only=True``, which refuses the message hub that every mmengine checkpoint holds, so resuming would fail;
* a torch module-registration hook (:func:`mmppma.models.backbones.release.install_parent_hook`): when an mmppma
  backbone becomes a module's child, that parent gets a load-state-dict pre-hook that converts a release state
  dict on load (mmpretrain's ``init_model`` / ``get_model``, ``load_checkpoint``, timm's ``checkpoint_path``).
  A module without an mmppma backbone child gets nothing, and a state dict not in a release's layout passes
  untouched;
* a one-shot ``sys.meta_path`` finder that registers the model index with ``ModelHub`` once mmpretrain's
  ``mmpretrain.apis.model`` is imported (mmppma itself does not import mmpretrain);
* mmengine checkpoint loaders for the release hosts' URLs (:func:`mmppma.utils.model_zoo.load_release_url`): the
  hosts name many files alike (``best.pth``), so each is cached under a name unique to its URL.
"""
import importlib.util

from .utils.checkpoint import allow_mmengine_checkpoint_globals
from .version import __version__

allow_mmengine_checkpoint_globals()

from . import engine, models  # noqa: E402,F401  (registers mmppma's classes)
from .models.backbones.release import register_release_loading  # noqa: E402
from .utils.model_zoo import register_with_mmpretrain  # noqa: E402

register_release_loading()
register_with_mmpretrain()

if importlib.util.find_spec('timm') is not None:  # timm is pinned (requirements.txt); registers the models there
    from . import timm_models  # noqa: E402,F401

__all__ = ['__version__']
