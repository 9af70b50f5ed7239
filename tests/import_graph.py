"""The import graph of a folder of mmppma, for the layout tests: module files, the imports each module makes (lazy
ones inside functions included) and the cycles of the graph."""
import ast
from pathlib import Path

MMPPMA = Path(__file__).resolve().parents[1] / 'mmppma'


def module_files(root: Path):
    """Dotted module name -> file, for every module and package under ``root`` (a folder of mmppma)."""
    base = tuple(root.relative_to(MMPPMA.parent).parts)
    return {'.'.join((*base, *p.relative_to(root).with_suffix('').parts)).removesuffix('.__init__'): p
            for p in sorted(root.rglob('*.py'))}


def imports(module: str, files: dict, scope: str):
    """The modules and packages of ``scope`` (a dotted prefix) that ``module`` imports, lazy imports included: each
    named module or package, and the packages above it that importing it initializes, except those ``module``
    lies in (Python has initialized them before ``module`` runs). A package that ``module`` lies in counts where
    ``module`` names it."""
    package = module if files[module].name == '__init__.py' else module.rpartition('.')[0]
    for node in ast.walk(ast.parse(files[module].read_text())):
        if isinstance(node, ast.ImportFrom):
            parts = package.split('.')[:len(package.split('.')) + 1 - node.level] if node.level else []
            base = '.'.join(parts + [node.module] if node.module else parts)
            targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in files else base for a in node.names]
        else:
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for target in targets:
            if target.startswith(scope) and target in files and target != module:
                yield target
            target = target.rpartition('.')[0]
            while target.startswith(scope) and not module.startswith(target + '.'):
                if target in files and target != module:
                    yield target
                target = target.rpartition('.')[0]


def cycles(graph: dict) -> list:
    """Every back edge of a depth-first walk, as the trail that closes it (empty: no cycle)."""
    state, found = {}, []

    def visit(node, trail):
        state[node] = 'open'
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 'open':
                found.append(trail + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 'done'

    for node in graph:
        if node not in state:
            visit(node, [node])
    return found
