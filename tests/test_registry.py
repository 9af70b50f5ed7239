"""mmppma's classes reach mmdet, mmseg and mmpretrain configs through the registry tree.

``type='mmppma.X'`` must work from configs that inherit each library's own base configs, with no
``import mmppma`` (a fresh process auto-imports it); the bare ``type='X'`` must work once mmppma is
imported; importing mmppma must not pull in any downstream library; and a name upstream already owns
must be refused.
"""
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

REPO = Path(__file__).resolve().parent.parent
# Two cheap stages, one of each attention type: registry tests need a real class, not a big one.
ARCH = dict(embed_dims=[16, 32], depths=[1, 1], num_heads=[2, 2], mlp_ratios=[2, 2],
            attn_types=['criss_cross', 'whole'])


def importorskip_scope(scope: str):
    """``scope``'s MODELS registry; skips (naming the import error) when its models cannot be imported."""
    pytest.importorskip(f'{scope}.models')  # the registry's location: imported on first lookup
    return pytest.importorskip(f'{scope}.registry').MODELS


def build_in_scope(scope: str, cfg: dict) -> nn.Module:
    """Build ``cfg`` from ``scope``'s MODELS registry, inside that default scope (as a Runner would)."""
    registry = importorskip_scope(scope)
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(cfg)


def config_from(tmp_path: Path, text: str) -> Config:
    path = tmp_path / 'config.py'
    path.write_text(textwrap.dedent(text))
    return Config.fromfile(str(path))


def test_installed_version_and_light_import(run_python):
    """``pip install -e .`` put this checkout on the path; importing mmppma imports no downstream library."""
    code = textwrap.dedent("""
        import importlib.metadata, sys
        import mmppma
        print(mmppma.__version__, importlib.metadata.version('mmppma'), mmppma.__file__)
        print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'mmdet', 'mmseg', 'mmpretrain'}))
    """)
    out = run_python(['-c', code], cwd=Path('/')).stdout.splitlines()  # cwd=/ : no import from the cwd
    version, dist_version, path = out[0].split()
    assert version == re.search(r"__version__ = '([^']+)'", (REPO / 'mmppma/version.py').read_text()).group(1)
    assert dist_version == version
    assert Path(path).resolve() == (REPO / 'mmppma/__init__.py').resolve()
    assert out[1] == 'LOADED []'


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


def test_mmdet_config_inheriting_mask_rcnn(tmp_path):
    pytest.importorskip('mmdet.models')
    cfg = config_from(
        tmp_path, f"""
        _base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
        model = dict(
            backbone=dict(_delete_=True, type='mmppma.PPMA', arch={ARCH!r}, out_indices=(0, 1)),
            neck=dict(in_channels={ARCH['embed_dims']!r}, num_outs=3))
        """)
    assert cfg.default_scope == 'mmdet'  # inherited from mmdet's runtime base
    backbone = build_in_scope('mmdet', cfg.model.backbone)
    neck = build_in_scope('mmdet', cfg.model.neck)
    assert isinstance(backbone, PPMA)
    feats = neck(backbone(torch.randn(1, 3, 32, 48)))
    assert [tuple(f.shape) for f in feats] == [(1, 256, 8, 12), (1, 256, 4, 6), (1, 256, 2, 3)]


def test_mmseg_config_inheriting_upernet(tmp_path):
    pytest.importorskip('mmseg.models')
    cfg = config_from(
        tmp_path, f"""
        _base_ = 'mmseg::_base_/models/upernet_r50.py'
        model = dict(backbone=dict(_delete_=True, type='mmppma.PPMA', arch={ARCH!r}, out_indices=(0, 1)))
        """)
    assert cfg.model.type == 'EncoderDecoder'
    backbone = build_in_scope('mmseg', cfg.model.backbone)
    assert isinstance(backbone, PPMA)
    assert [out.shape[1] for out in backbone(torch.randn(1, 3, 32, 32))] == ARCH['embed_dims']


def test_mmpretrain_config_inheriting_resnet18(tmp_path):
    """The whole ImageClassifier: mmpretrain's neck and head around mmppma's backbone."""
    pytest.importorskip('mmpretrain.models')
    cfg = config_from(
        tmp_path, f"""
        _base_ = 'mmpretrain::_base_/models/resnet18.py'
        model = dict(
            backbone=dict(_delete_=True, type='mmppma.PPMA', arch={ARCH!r}, out_indices=(1, )),
            head=dict(in_channels={ARCH['embed_dims'][-1]}, num_classes=7))
        """)
    classifier = build_in_scope('mmpretrain', cfg.model).eval()
    assert isinstance(classifier.backbone, PPMA)
    with torch.no_grad():
        assert classifier(torch.randn(2, 3, 32, 32), mode='tensor').shape == (2, 7)


def test_readme_example_config():
    """The README's 30-second Mask R-CNN config: its backbone builds and the neck channels match it."""
    pytest.importorskip('mmdet.models')
    text = (REPO / 'README.md').read_text()
    block = next(b for b in re.findall(r'```python\n(.*?)```', text, re.S) if 'mmdet::mask_rcnn' in b)
    cfg = Config.fromstring(block, file_format='.py')
    backbone = build_in_scope('mmdet', cfg.model.backbone)
    assert isinstance(backbone, PPMA)
    assert list(cfg.model.neck.in_channels) == backbone.embed_dims


def test_readme_versions_match_requirements():
    """The README's "Supported versions" table states the versions requirements.txt pins."""
    pins = dict(re.findall(r'^([A-Za-z0-9_.-]+)==([^\s,;]+)', (REPO / 'requirements.txt').read_text(), re.M))
    readme = (REPO / 'README.md').read_text()
    table = readme[readme.index('## Supported versions'):].split('\n## ')[0]
    rows = dict(re.findall(r'^\| ([A-Za-z0-9_.-]+) \| (\S+?)[,\s|]', table, re.M))
    rows.pop('package', None)  # the header
    for name in ('torch', 'mmengine', 'mmcv', 'mmpretrain', 'mmdet', 'mmsegmentation', 'numpy', 'setuptools'):
        assert name in rows, f'README "Supported versions" lacks {name}'
    for name, version in rows.items():
        assert name in pins, f'README lists {name}, which requirements.txt does not pin'
        assert version == pins[name], f'README says {name} {version}, requirements.txt pins {pins[name]}'


def test_constructors_in_the_root_registry():
    """Bare and prefixed backbone names in every scope: tests/models/test_backbone_contract.py."""
    for name in ('LayerDecayOptimWrapperConstructor', 'mmppma.LayerDecayOptimWrapperConstructor'):
        assert ROOT_CONSTRUCTORS.get(name) is mmppma.engine.LayerDecayOptimWrapperConstructor


def test_name_owned_by_root_registry_is_refused():
    from mmengine.model import BaseDataPreprocessor  # registers mmengine's own models in the root
    assert ROOT_MODELS.get('BaseDataPreprocessor') is BaseDataPreprocessor
    clash = type('BaseDataPreprocessor', (nn.Module, ), {})
    with pytest.raises(KeyError, match='BaseDataPreprocessor'):
        register_model(clash)
    assert ROOT_MODELS.get('BaseDataPreprocessor') is BaseDataPreprocessor


def test_refused_name_leaves_no_trace():
    """A refused registration must not leave a half-registered class in mmppma's registry."""
    clash = type('BaseDataPreprocessor', (nn.Module, ), {})
    try:
        with pytest.raises(KeyError):
            register_model(clash)
        assert 'BaseDataPreprocessor' not in MODELS.module_dict
    finally:
        if MODELS.module_dict.get('BaseDataPreprocessor') is clash:
            del MODELS.module_dict['BaseDataPreprocessor']


def test_second_class_with_an_mmppma_name_is_refused():
    impostor = type('PPMA', (nn.Module, ), {})
    with pytest.raises(KeyError, match='PPMA'):
        register_model(impostor)
    assert MODELS.get('PPMA') is PPMA and ROOT_MODELS.get('PPMA') is PPMA


def test_new_class_is_registered_in_both_and_buildable():
    """register_model on a new class: buildable as mmppma.X and as X (removed again afterwards)."""
    name = 'MmppmaRegistryTestOnlyModule'

    class Module(nn.Linear):

        def __init__(self, width: int = 3) -> None:
            super().__init__(width, width)

    Module.__name__ = Module.__qualname__ = name
    try:
        register_model(Module)
        assert isinstance(MODELS.build(dict(type=name, width=4)), Module)
        with DefaultScope.overwrite_default_scope('mmengine'):
            assert ROOT_MODELS.build(dict(type=f'mmppma.{name}', width=5)).in_features == 5
            assert ROOT_MODELS.build(dict(type=name)).in_features == 3
    finally:
        for registry in (MODELS, ROOT_MODELS):
            registry.module_dict.pop(name, None)
    assert name not in MODELS.module_dict and name not in ROOT_MODELS.module_dict
