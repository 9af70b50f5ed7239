"""No import circles in mmppma.models: each module imports first (the packages above mmppma.models left out),
and the graph of the modules' imports, lazy ones (inside functions) and the packages they initialize included,
is acyclic."""

from ..import_graph import MMPPMA, cycles, imports, module_files

MODELS = MMPPMA / 'models'


FILES = module_files(MODELS)
# mmppma's modules outside mmppma.models (its registry scope, the ops) stay loaded, and registration is a no-op:
# a scope and a class name register once per process
IMPORT_EACH_FIRST = '''import importlib, sys, types
for package, path in (('mmppma', {mmppma!r}), ('mmppma.models', {models!r})):
    sys.modules[package] = types.ModuleType(package)
    sys.modules[package].__path__ = [path]
importlib.import_module('mmppma.registry').register_model = lambda cls: cls
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.startswith('mmppma.models.')]:
        del sys.modules[loaded]
    importlib.import_module(name)
'''


def test_the_cycle_finder_sees_a_lazy_import_circle(tmp_path):
    (tmp_path / 'pkg').mkdir()
    (tmp_path / 'pkg' / '__init__.py').write_text('')
    (tmp_path / 'pkg' / 'a.py').write_text('from . import b\n')
    (tmp_path / 'pkg' / 'b.py').write_text('def f():\n    from .a import x\n')
    files = {'pkg': tmp_path / 'pkg' / '__init__.py', 'pkg.a': tmp_path / 'pkg' / 'a.py',
             'pkg.b': tmp_path / 'pkg' / 'b.py'}
    graph = {m: set(imports(m, files, 'pkg')) for m in files}
    assert graph == {'pkg': set(), 'pkg.a': {'pkg.b'}, 'pkg.b': {'pkg.a'}}
    assert cycles(graph) == [['pkg.a', 'pkg.b', 'pkg.a']]


def test_no_import_circles(run_python):
    run_python(['-c', IMPORT_EACH_FIRST.format(mmppma=str(MMPPMA), models=str(MODELS)), *FILES])
    graph = {m: set(imports(m, FILES, 'mmppma.models')) for m in FILES}
    assert not cycles(graph), f'import circles: {cycles(graph)}'
    # each family's spec (its release format too) sits beside its backbone; the converter knows the families only
    # through the registry
    for family in ('ppma', 'mlla', 'vminet'):
        assert graph[f'mmppma.models.backbones.{family}_spec'] >= {
            f'mmppma.models.backbones.{family}', 'mmppma.models.backbones.family', 'mmppma.models.backbones.release'}
    assert 'mmppma.models.backbones.release' in graph['mmppma.models.backbones.base']
    assert 'mmppma.models.backbones.family' in graph['mmppma.models.conversion.checkpoint_convert']
    assert not {m for m in graph['mmppma.models.conversion.checkpoint_convert'] if m.endswith('_spec')}
