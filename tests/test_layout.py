"""The layout of the whole of mmppma, read from its imports (lazy ones inside functions included): no import circle
anywhere, each layer importing only those below it (docs/code_layout.md), and the old import paths naming the
new ones."""
import importlib

import pytest

from .import_graph import MMPPMA, SHIMS, cycles, imports, module_files

FILES = module_files(MMPPMA)
GRAPH = {m: set(imports(m, FILES, 'mmppma')) for m in FILES}
#: modules every layer may import: the registry, the version, the argument checks, the checkpoint allowlist
BASE = {'mmppma.version', 'mmppma.registry', 'mmppma.utils', 'mmppma.utils.checks', 'mmppma.utils.checkpoint'}
#: package prefix -> layer, inner to outer; the first prefix that matches decides; anything else is the top
LAYERS = (('mmppma.ops', 1), ('mmppma.models.layers', 2), ('mmppma.models.backbones', 3), ('mmppma.deploy', 4),
          ('mmppma.models', 5), ('mmppma.engine', 5), ('mmppma.utils.configs', 5))


def layer(module: str) -> int:
    if module in BASE:
        return 0
    return next((rank for prefix, rank in LAYERS if module == prefix or module.startswith(prefix + '.')), 6)


def test_the_graph_covers_every_module_of_the_package():
    on_disk = {p for p in MMPPMA.rglob('*.py')}
    assert set(FILES.values()) | {MMPPMA.joinpath(*m.split('.')[1:]).with_suffix('.py') for m in SHIMS} >= {
        p for p in on_disk if p.name != '__init__.py'}
    assert {'mmppma', 'mmppma.deploy.runtime', 'mmppma.timm_models', 'mmppma.utils.runner_setup'} <= set(GRAPH)


def test_no_import_circles_in_mmppma():
    assert not cycles(GRAPH), f'import circles: {cycles(GRAPH)}'


def test_each_layer_imports_only_those_below_it():
    upward = sorted(f'{m} -> {t}' for m, targets in GRAPH.items() for t in targets if layer(t) > layer(m))
    assert not upward, upward
    # the deployment package is layered inside too: the runtime at its base imports nothing of mmppma
    assert not GRAPH['mmppma.deploy.runtime']
    assert 'mmppma.deploy.export' not in GRAPH['mmppma.deploy.mask_rcnn']


def test_the_layer_rule_sees_an_upward_import():
    assert layer('mmppma.models.backbones.base') < layer('mmppma.deploy.export') < layer('mmppma.timm_models')


@pytest.mark.parametrize('old, new', sorted(SHIMS.items()))
def test_an_old_import_path_names_the_new_one(old, new):
    with pytest.raises(ImportError, match=new.replace('.', r'\.')):
        importlib.import_module(old)


@pytest.mark.parametrize('module, old, new', [
    ('mmppma.timm_models', 'FAMILIES', 'TIMM_FAMILIES'),
    ('mmppma.models.conversion', 'FAMILIES', 'RELEASE_FAMILIES'),
    ('mmppma.models.conversion.checkpoint_convert', 'FAMILIES', 'RELEASE_FAMILIES'),
    ('mmppma.models.backbones.ppma_release', 'inspect', 'measure'),
    ('mmppma.models.backbones.mlla_release', 'inspect', 'measure'),
    ('mmppma.models.backbones.vminet_release', 'inspect', 'measure'),
])
def test_an_old_attribute_name_names_the_new_one(module, old, new):
    with pytest.raises(ImportError, match=rf'{old} is now {new}\b'):
        exec(f'from {module} import {old}', {})
    assert hasattr(importlib.import_module(module), new)
    with pytest.raises(AttributeError, match='no attribute'):  # other missing names keep the usual error
        getattr(importlib.import_module(module), 'no_such_name')
