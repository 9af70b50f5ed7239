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


def test_every_op_dispatches_through_its_plan():
    """Each op with implementations is declared once, in its package's ``__init__``, as a
    :class:`~mmppma.ops.plan.Op` of its name, whose reference, torch and Triton modules hold its path builders."""
    import importlib

    import pytest

    from mmppma.ops.plan import IMPLEMENTATIONS, Op
    pytest.importorskip('triton')
    declared = {}
    for name in FILES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, Op):
                declared.setdefault(value.name, {})[name] = value
    assert set(declared) == set(IMPLEMENTATIONS), declared
    for op, where in declared.items():
        assert len(where) == 1 and next(iter(where)).count('.') == 2, (op, where)  # mmppma.ops.<package>
        spec = next(iter(where.values()))
        modules = {'reference': spec.reference, 'torch_impl': spec.torch, 'triton_impl': spec.triton}
        for kind, module in modules.items():
            assert module.__name__.rsplit('.', 1)[-1] in (kind, 'torch_impl'), (op, kind, module)
            assert callable(getattr(module, f'{op}_plan', None)), (op, module)
