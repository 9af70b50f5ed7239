"""The ops' caches, behind one registry: every cache is made by :func:`register_cache` under a name, with a bound on
its entries, and :func:`clear_caches` empties them all (what the tests call to forget what the ops learnt).

A :class:`BoundedCache` is a dict: a hit is a plain ``cache.get(key)`` (no Python call: the launch plans are read on
every op call, docs/host_cost.md); an entry is added with ``cache[key] = value``, which drops the oldest entry once
the cache holds ``maxsize``. A dropped entry is rebuilt when its key comes again.
"""
from typing import Dict

__all__ = ['BoundedCache', 'register_cache', 'clear_caches', 'registered']


class BoundedCache(dict):
    """A dict of at most ``maxsize`` entries: adding one to a full cache drops the oldest (first added) entry."""

    __slots__ = ('name', 'maxsize')

    def __init__(self, name: str, maxsize: int) -> None:
        super().__init__()
        if maxsize < 1:
            raise ValueError(f'cache {name!r}: maxsize must be at least 1, got {maxsize}')
        self.name, self.maxsize = name, maxsize

    def __setitem__(self, key, value) -> None:
        if len(self) >= self.maxsize and key not in self:
            del self[next(iter(self))]
        super().__setitem__(key, value)

    def __repr__(self) -> str:
        return f'BoundedCache({self.name!r}, {len(self)}/{self.maxsize} entries)'


_REGISTRY: Dict[str, BoundedCache] = {}


def register_cache(name: str, maxsize: int) -> BoundedCache:
    """A new empty cache of at most ``maxsize`` entries, registered as ``name``: one cache per name (a module run
    again replaces its caches)."""
    cache = _REGISTRY[name] = BoundedCache(name, maxsize)
    return cache


def clear_caches() -> None:
    """Empty every registered cache: the ops' launch plans, the preflight's verdicts, the kernels' launch parameters,
    the device properties read once and the warnings given once. The next call of an op decides anew."""
    for cache in _REGISTRY.values():
        cache.clear()


def registered() -> Dict[str, BoundedCache]:
    """The registered caches by name (a copy of the registry; the caches themselves)."""
    return dict(_REGISTRY)
