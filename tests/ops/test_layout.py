"""No import circles in mmppma.ops: each module imports first in a fresh interpreter (the packages' __init__ left
out), and the graph of the modules' imports, lazy ones and the packages they initialize included, is acyclic."""
from ..import_graph import MMPPMA, cycles, imports, module_files

OPS = MMPPMA / 'ops'
FILES = module_files(OPS)
IMPORT_EACH_FIRST = '''import importlib, sys, types
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split('.')[0] == 'mmppma']:
        del sys.modules[loaded]
    for package, path in (('mmppma', {mmppma!r}), ('mmppma.ops', {ops!r})):
        sys.modules[package] = types.ModuleType(package)
        sys.modules[package].__path__ = [path]
    importlib.import_module(name)
'''


def test_no_import_circles(run_python):
    run_python(['-c', IMPORT_EACH_FIRST.format(mmppma=str(OPS.parent), ops=str(OPS)), *FILES])
    graph = {m: set(imports(m, FILES, 'mmppma.ops')) for m in FILES}
    assert not cycles(graph), f'import circles: {cycles(graph)}'
    assert graph['mmppma.ops.criss_cross.triton_impl'] >= {'mmppma.ops.line.triton_impl', 'mmppma.ops.line'}
