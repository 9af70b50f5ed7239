"""The release models' index (one ``metafile.yml`` per family variant that has one, named by its family's spec;
``mmppma/.mim/model-index.yml`` lists them for mim) and its registration with mmpretrain's ``ModelHub``, so that
``mmpretrain.list_models('*ppma*')``, ``get_model(name, pretrained=True)`` and the Inferencers find mmppma's
release models by name.

``import mmppma`` registers the index once mmpretrain's ``mmpretrain.apis.model`` is imported: at once if it
already is, else right after it is (a one-shot finder on ``sys.meta_path``); mmppma itself never imports
mmpretrain. The index's config paths are relative to the directory holding ``configs/``: the package's
``.mim`` (a wheel, where the build copies the configs) or the checkout (an editable install).

Release weights are downloaded by mmengine's checkpoint loaders into torch hub's cache
(``$TORCH_HOME/checkpoints``). The releases' hosts name many files alike (every PPMA classifier is
``best.pth``), or not at all (TsinghuaCloud's ``/f/<id>/?dl=1``), so :func:`load_release_url` is registered
as mmengine's loader for those hosts and caches each file under a name unique to its URL.
"""
import importlib.abc
import importlib.util
import os.path as osp
import re
import sys
from pathlib import Path
from typing import Callable, List, Optional
from urllib.parse import urlparse

PACKAGE = Path(__file__).resolve().parents[1]
MODEL_INDEX = PACKAGE / '.mim' / 'model-index.yml'
METAFILES = PACKAGE / '.mim' / 'metafiles'
#: the release hosts whose files are cached under a name unique to the URL (:func:`cache_name`)
RELEASE_HOSTS = ('https://huggingface.co/ZhongchenZhao/PPMA/', 'https://cloud.tsinghua.edu.cn/f/',
                 'https://github.com/yws-wxs/VMINet/releases/')
_MODELHUB_MODULE = 'mmpretrain.apis.model'
_state = dict(registered=False, loader=False)


def config_root() -> Path:
    """The directory whose ``configs/`` the index's config paths start from: the package's ``.mim`` when the
    build copied the configs there, else the checkout holding the package."""
    shipped = PACKAGE / '.mim'
    return shipped if (shipped / 'configs').is_dir() else PACKAGE.parent


def cache_name(url: str) -> str:
    """A file name unique to ``url``: its host and path, non-alphanumerics as ``_``, keeping the extension
    (``huggingface.co_ZhongchenZhao_PPMA_resolve_main_checkpoints_..._best.pth``)."""
    parts = urlparse(url)
    stem = re.sub(r'[^0-9A-Za-z.-]+', '_', f'{parts.netloc}{parts.path}').strip('_')
    return stem if re.search(r'\.(pth|pt|tar)$', stem) else f'{stem}.pth'


def load_release_url(filename: str, map_location=None, logger=None):
    """mmengine checkpoint loader for :data:`RELEASE_HOSTS`: download ``filename`` once into torch hub's
    ``checkpoints`` directory under :func:`cache_name`, then load it (torch hub's loader)."""
    import torch
    model_dir = osp.join(torch.hub.get_dir(), 'checkpoints')
    return torch.hub.load_state_dict_from_url(filename, model_dir=model_dir, map_location=map_location,
                                              file_name=cache_name(filename))


def register_release_url_loader() -> None:
    """Register :func:`load_release_url` with mmengine's ``CheckpointLoader`` for the release hosts (longer
    prefixes than ``https://``, so mmengine picks it for them and its own loader for every other URL)."""
    if _state['loader']:
        return
    from mmengine.runner.checkpoint import CheckpointLoader
    CheckpointLoader.register_scheme(prefixes=RELEASE_HOSTS, loader=load_release_url)
    _state['loader'] = True


def metafiles() -> List[Path]:
    """The metafile of every registered family variant that has one (``Variant.metafile``)."""
    from mmppma.models.backbones.family import variants
    return [METAFILES / v.metafile / 'metafile.yml' for v in variants() if v.metafile]


def register_model_index() -> None:
    """Register the registered families' metafiles (:func:`metafiles`) with mmpretrain's ``ModelHub`` (once per
    process)."""
    if _state['registered']:
        return
    from mmpretrain.apis.model import ModelHub
    for path in metafiles():
        ModelHub.register_model_index(str(path), config_prefix=str(config_root()))
    _state['registered'] = True


class _AfterImport(importlib.abc.MetaPathFinder):
    """One-shot finder: lets the other finders find module ``name`` and runs ``callback`` once it is
    executed."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenCall(spec.loader, self.callback)
        return spec


class _ThenCall(importlib.abc.Loader):
    """``loader`` (its other methods too: ``get_source``, ``is_package``, ...), then ``callback``."""

    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[], None]) -> None:
        self.loader, self.callback = loader, callback

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.callback()


def register_with_mmpretrain(installed: Optional[bool] = None) -> None:
    """Register the index with ``ModelHub`` now if mmpretrain's ``apis.model`` is imported, else when it is
    (nothing when mmpretrain is not installed); and the release URL loader."""
    register_release_url_loader()
    if _MODELHUB_MODULE in sys.modules:
        register_model_index()
        return
    if installed is None:
        installed = importlib.util.find_spec('mmpretrain') is not None
    if installed and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_MODELHUB_MODULE, register_model_index))
