"""mmppma's classes in the registry tree: ``type='mmppma.X'`` from configs on upstream bases, auto-imported in a fresh
process; bare names once imported; no downstream library imported by mmppma; names upstream owns refused."""
import re
import textwrap
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS as ROOT_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as ROOT_CONSTRUCTORS
from mmengine.registry import DefaultScope
from torch import nn

import mmppma
from mmppma.models import PPMA
from mmppma.registry import MODELS, register_model

from .conftest import REPO_ROOT

# Two cheap stages, one of each attention type: registry tests need a real class, not a big one.
ARCH = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[2, 2], mlp_ratios=[2, 2],
            attn_types=['criss_cross', 'whole'])


def build_in_scope(scope: str, cfg: dict) -> nn.Module:
    """Build ``cfg`` from ``scope``'s MODELS registry inside that default scope (as a Runner would); skips, naming
    the import error, when the library's models cannot be imported."""
    pytest.importorskip(f'{scope}.models')
    with DefaultScope.overwrite_default_scope(scope):
        return pytest.importorskip(f'{scope}.registry').MODELS.build(cfg)


def test_installed_version_and_light_import(run_python):
    """``pip install -e .`` put this checkout on the path; importing mmppma imports no downstream library."""
    code = textwrap.dedent("""
        import importlib.metadata, sys
        import mmppma
        print(mmppma.__version__, importlib.metadata.version('mmppma'), mmppma.__file__)
        print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'mmdet', 'mmseg', 'mmpretrain'}))
    """)
    out = run_python(['-c', code], cwd='/').stdout.splitlines()  # cwd=/ : no import from the cwd
    version, dist_version, path = out[0].split()
    assert version == dist_version == re.search(r"__version__ = '([^']+)'",
                                                 (REPO_ROOT / 'mmppma/version.py').read_text()).group(1)
    assert Path(path).resolve() == (REPO_ROOT / 'mmppma/__init__.py').resolve() and out[1] == 'LOADED []'


def test_prefixed_name_auto_imports_mmppma_in_fresh_process(run_python):
    """No ``import mmppma`` and no custom_imports: the ``mmppma.`` prefix makes mmengine import it."""
    pytest.importorskip('mmdet.models')
    code = textwrap.dedent(f"""
        import sys
        from mmengine.registry import DefaultScope
        from mmdet.registry import MODELS, OPTIM_WRAPPER_CONSTRUCTORS
        assert 'mmppma' not in sys.modules
        with DefaultScope.overwrite_default_scope('mmdet'):
            model = MODELS.build(dict(type='mmppma.PPMA', arch={ARCH!r}, out_indices=(1, )))
            constructor = OPTIM_WRAPPER_CONSTRUCTORS.get('mmppma.LayerDecayOptimWrapperConstructor')
        print(type(model).__module__, type(model).__name__, constructor.__module__)
    """)
    out = run_python(['-c', code]).stdout.split()
    assert out == ['mmppma.models.backbones.ppma', 'PPMA', 'mmppma.engine.layer_decay_optim_wrapper_constructor']


def test_readme_mask_rcnn_config_on_mmdets_base():
    """The README's 30-second config: mmdet's Mask R-CNN base (default scope mmdet) with PPMA-T's neck channels;
    with a small arch, FPN runs on the backbone's outputs (mmseg's bases: tests/models/test_downstream.py)."""
    text = (REPO_ROOT / 'README.md').read_text()
    block = next(b for b in re.findall(r'```python\n(.*?)```', text, re.S) if 'mmdet::mask_rcnn' in b)
    cfg = Config.fromstring(block, file_format='.py')
    assert cfg.default_scope == 'mmdet' and cfg.model.backbone.arch == 'tiny'
    assert list(cfg.model.neck.in_channels) == PPMA.arch_zoo['tiny']['embed_dims']
    cfg.model.backbone.update(arch=ARCH, out_indices=(0, 1))
    cfg.model.neck.update(in_channels=ARCH['embed_dims'], num_outs=3)
    backbone = build_in_scope('mmdet', cfg.model.backbone)
    feats = backbone(torch.randn(1, 3, 32, 48))
    assert isinstance(backbone, PPMA) and [tuple(f.shape) for f in feats] == [(1, 16, 8, 12), (1, 32, 4, 6)]
    assert [tuple(f.shape) for f in build_in_scope('mmdet', cfg.model.neck)(feats)] == \
        [(1, 256, 8, 12), (1, 256, 4, 6), (1, 256, 2, 3)]


def test_mmpretrain_classifier_base_around_the_backbone():
    """mmpretrain's whole ResNet-18 classifier config, its neck and head around mmppma's backbone."""
    cfg = Config.fromstring(f"""_base_ = 'mmpretrain::_base_/models/resnet18.py'
model = dict(backbone=dict(_delete_=True, type='mmppma.PPMA', arch={ARCH!r}, out_indices=(1, )),
             head=dict(in_channels={ARCH['embed_dims'][-1]}, num_classes=7))""", file_format='.py')
    classifier = build_in_scope('mmpretrain', cfg.model).eval()
    assert isinstance(classifier.backbone, PPMA)
    with torch.no_grad():
        assert classifier(torch.randn(2, 3, 32, 32), mode='tensor').shape == (2, 7)


def test_readme_versions_match_requirements():
    """The README's "Supported versions" table states the versions requirements.txt pins."""
    pins = dict(re.findall(r'^([A-Za-z0-9_.-]+)==([^\s,;]+)', (REPO_ROOT / 'requirements.txt').read_text(), re.M))
    readme = (REPO_ROOT / 'README.md').read_text()
    table = readme[readme.index('## Supported versions'):].split('\n## ')[0]
    rows = dict(re.findall(r'^\| ([A-Za-z0-9_.-]+) \| (\S+?)[,\s|]', table, re.M))
    rows.pop('package', None)  # the header
    for name in ('torch', 'mmengine', 'mmcv', 'mmpretrain', 'mmdet', 'mmsegmentation', 'numpy', 'setuptools'):
        assert name in rows, f'README "Supported versions" lacks {name}'
    assert {name: pins.get(name) for name in rows} == rows, 'README versions vs requirements.txt pins'


def test_constructors_in_the_root_registry():
    """Both optimizer wrapper constructors by bare and prefixed name (backbones: tests/models/
    test_backbone_contract.py)."""
    for cls in (mmppma.engine.LayerDecayOptimWrapperConstructor, mmppma.engine.ParamwiseOptimWrapperConstructor):
        for name in (cls.__name__, f'mmppma.{cls.__name__}'):
            assert ROOT_CONSTRUCTORS.get(name) is cls, name


def test_taken_names_are_refused_without_a_trace():
    """A name the root registry owns (mmengine's) or mmppma owns (another class): KeyError, nothing half-registered
    in mmppma's registry, the owner unchanged."""
    from mmengine.model import BaseDataPreprocessor  # registers mmengine's own models in the root
    for name, owner in (('BaseDataPreprocessor', BaseDataPreprocessor), ('PPMA', PPMA)):
        clash = type(name, (nn.Module, ), {})
        try:
            with pytest.raises(KeyError, match=name):
                register_model(clash)
            assert MODELS.module_dict.get(name) is {'PPMA': PPMA}.get(name) and ROOT_MODELS.get(name) is owner
        finally:
            if MODELS.module_dict.get(name) is clash:
                del MODELS.module_dict[name]


def test_new_class_is_registered_in_both_and_buildable():
    """register_model on a new class: buildable as mmppma.X and as X (removed again afterwards)."""
    name = 'MmppmaRegistryTestOnlyModule'
    module = type(name, (nn.Linear, ), {'__init__': lambda self, width=3: nn.Linear.__init__(self, width, width)})
    try:
        register_model(module)
        assert isinstance(MODELS.build(dict(type=name, width=4)), module)
        with DefaultScope.overwrite_default_scope('mmengine'):
            assert ROOT_MODELS.build(dict(type=f'mmppma.{name}', width=5)).in_features == 5
            assert ROOT_MODELS.build(dict(type=name)).in_features == 3
    finally:
        for registry in (MODELS, ROOT_MODELS):
            registry.module_dict.pop(name, None)
    assert name not in MODELS.module_dict and name not in ROOT_MODELS.module_dict
