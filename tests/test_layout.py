"""The layout of the whole of mmppma, read from its imports (lazy ones inside functions included): no import circle
anywhere, each layer importing only those below it (docs/code_layout.md), and the old import paths naming the
new ones."""


from .import_graph import MMPPMA, cycles, imports, module_files

FILES = module_files(MMPPMA)
GRAPH = {m: set(imports(m, FILES, 'mmppma')) for m in FILES}
#: modules every layer may import: the registry, the version, the argument checks, the checkpoint allowlist, a
#: config's model built through the registries
BASE = {'mmppma.version', 'mmppma.registry', 'mmppma.utils', 'mmppma.utils.checks', 'mmppma.utils.checkpoint',
        'mmppma.utils.configs'}
#: package prefix -> layer, inner to outer; the first prefix that matches decides; anything else is the top
LAYERS = (('mmppma.ops', 1), ('mmppma.models.layers', 2), ('mmppma.models.backbones', 3), ('mmppma.deploy', 4),
          ('mmppma.models', 5), ('mmppma.engine', 5))


def layer(module: str) -> int:
    if module in BASE:
        return 0
    return next((rank for prefix, rank in LAYERS if module == prefix or module.startswith(prefix + '.')), 6)


def test_the_graph_covers_every_module_of_the_package():
    on_disk = {p for p in MMPPMA.rglob('*.py')}
    assert set(FILES.values()) == on_disk
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


def test_the_graph_counts_a_named_package_the_module_lies_in(tmp_path):
    """An import of the package top, or of the module's own package, is an edge (a circle through an __init__);
    the packages that importing a module initializes are edges only where the module does not lie in them."""
    files = {'pkg': tmp_path / 'pkg' / '__init__.py', 'pkg.sub': tmp_path / 'pkg' / 'sub' / '__init__.py',
             'pkg.sub.a': tmp_path / 'pkg' / 'sub' / 'a.py', 'pkg.sub.b': tmp_path / 'pkg' / 'sub' / 'b.py',
             'pkg.other': tmp_path / 'pkg' / 'other.py'}
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    files['pkg'].write_text('from . import other\n')
    files['pkg.sub'].write_text('from .a import f\n')
    files['pkg.sub.b'].write_text('from ..other import g\n')
    files['pkg.other'].write_text('')
    files['pkg.sub.a'].write_text('def f():\n    import pkg\n    from . import b\n    from . import h\n')
    assert set(imports('pkg.sub.a', files, 'pkg')) == {'pkg', 'pkg.sub.b', 'pkg.sub'}
    assert set(imports('pkg.sub.b', files, 'pkg')) == {'pkg.other'}
    assert cycles({m: set(imports(m, files, 'pkg')) for m in files}) == [['pkg.sub', 'pkg.sub.a', 'pkg.sub']]
