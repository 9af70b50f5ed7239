"""The ops' caches (mmppma.ops.caches): one registry, each cache bounded, all emptied by ``mmppma.ops.clear_caches``;
no other module-level dict, set or list in mmppma/ops that the ops fill."""
import ast

import pytest
import torch

from mmppma import ops
from mmppma.ops.caches import BoundedCache, registered

from ..import_graph import MMPPMA
from . import oracle


def test_a_full_cache_drops_its_oldest_entry():
    cache = BoundedCache('test_bounded', 2)
    cache['a'], cache['b'] = 1, 2
    cache['a'] = 3  # a key it holds: replaced, nothing dropped
    cache['c'] = 4
    assert cache == {'b': 2, 'c': 4} and cache.get('a') is None
    with pytest.raises(ValueError, match='maxsize'):
        BoundedCache('test_empty', 0)


def test_clear_caches_forgets_the_plans(monkeypatch):
    """An op's call fills its plan (and, on the simulated GPU, the preflight's verdict and the launch parameters);
    ``clear_caches`` empties every registered cache, and the next call builds its plan again."""
    pytest.importorskip('triton')
    monkeypatch.setenv(ops.devices.SIMULATE_VAR, '90')
    q, k, v, la, lb = oracle.inputs(1, 1, 3, 4, 16, dtype=torch.float32)
    ops.ppma_attention(q, k, v, la, lb)
    caches = registered()
    assert {'plans', 'preflight', 'whole_forward_launches', 'environment_keys'} <= set(caches)
    assert all(caches[name] for name in ('plans', 'preflight', 'whole_forward_launches'))
    assert all(len(cache) <= cache.maxsize for cache in caches.values())
    ops.clear_caches()
    assert not any(caches.values())
    ops.ppma_attention(q, k, v, la, lb)
    assert caches['plans'] and caches['preflight']


def test_no_other_module_level_cache():
    """Module-level mutable containers in mmppma/ops are the registry's caches (made by register_cache) or the
    recording stacks of the launches; nothing else a module fills at run time."""
    found = []
    for path in sorted((MMPPMA / 'ops').rglob('*.py')):
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            empty = (isinstance(value, (ast.Set, ast.List)) and not value.elts
                     or isinstance(value, ast.Dict) and not value.keys
                     or isinstance(value, ast.Call) and getattr(value.func, 'id', None) in ('dict', 'set', 'list')
                     and not value.args)
            if empty:
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                found.append(f'{path.stem}.{target.id}')
    assert sorted(found) == ['caches._REGISTRY', 'launch._EXECUTED', 'launch._RECORDING'], found
