"""No import circles in mmppma.ops: each module imports first in a fresh interpreter (the packages' __init__ left
out), and the graph of the modules' imports, lazy ones and the packages they initialize included, is acyclic."""
import ast
from pathlib import Path

OPS = Path(__file__).resolve().parents[2] / 'mmppma' / 'ops'
FILES = {'.'.join(('mmppma', 'ops', *p.relative_to(OPS).with_suffix('').parts)).removesuffix('.__init__'): p
         for p in sorted(OPS.rglob('*.py'))}
IMPORT_EACH_FIRST = '''import importlib, sys, types
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split('.')[0] == 'mmppma']:
        del sys.modules[loaded]
    for package, path in (('mmppma', {mmppma!r}), ('mmppma.ops', {ops!r})):
        sys.modules[package] = types.ModuleType(package)
        sys.modules[package].__path__ = [path]
    importlib.import_module(name)
'''


def _imports(module: str):
    """The mmppma.ops modules and packages that importing ``module`` loads, except the packages it lies in."""
    package = module if FILES[module].name == '__init__.py' else module.rpartition('.')[0]
    for node in ast.walk(ast.parse(FILES[module].read_text())):
        if isinstance(node, ast.ImportFrom):
            parts = package.split('.')[:len(package.split('.')) + 1 - node.level] if node.level else []
            base = '.'.join(parts + [node.module] if node.module else parts)
            targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in FILES else base for a in node.names]
        else:
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for target in targets:
            while target.startswith('mmppma.ops') and not module.startswith(target + '.'):
                if target in FILES and target != module:
                    yield target
                target = target.rpartition('.')[0]


def test_no_import_circles(run_python):
    run_python(['-c', IMPORT_EACH_FIRST.format(mmppma=str(OPS.parent), ops=str(OPS)), *FILES])
    graph, state, cycles = {m: set(_imports(m)) for m in FILES}, {}, []

    def visit(node, trail):
        state[node] = 'open'
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 'open':
                cycles.append(trail + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 'done'

    for module in FILES:
        if module not in state:
            visit(module, [module])
    assert not cycles, f'import circles: {cycles}'
    assert graph['mmppma.ops.criss_cross.triton_impl'] >= {'mmppma.ops.line.triton_impl', 'mmppma.ops.line'}
