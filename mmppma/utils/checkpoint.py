"""Let ``torch.load(weights_only=True)`` read full mmengine checkpoints.

torch >= 2.6 loads with ``weights_only=True`` by default. mmengine 0.10.7 calls ``torch.load`` without
the argument, so resuming a run (``resume=True``) or loading a checkpoint that holds mmengine's message
hub fails with ``Unsupported global: GLOBAL mmengine.logging.history_buffer.HistoryBuffer``.

Rather than turning the safe loader off, :func:`allow_mmengine_checkpoint_globals` allowlists exactly the
globals an mmengine checkpoint contains (found by saving with a ``Runner`` and reading the checkpoint's
globals with ``torch.serialization.get_unsafe_globals_in_checkpoint``):

* ``mmengine.logging.history_buffer.HistoryBuffer`` - the message hub's logged scalars;
* numpy arrays, scalars and the dtypes of plain numeric / bool / string data (``numpy.ndarray``,
  ``numpy._core.multiarray._reconstruct`` and ``.scalar``, ``numpy.dtype`` and its per-type classes);
  object and void dtypes stay refused;
* ``builtins.getattr`` - a HistoryBuffer pickles its statistics methods as ``getattr(HistoryBuffer,
  'mean')``. The real ``getattr`` would let a file reach any attribute of any allowlisted object, so a
  restricted stand-in is registered under that name: it only returns public methods of HistoryBuffer.

Everything else a checkpoint may hold still raises torch's own error, which names the global.
"""
import builtins
import pickle
from typing import Any, Callable, List, Tuple, Union

import numpy as np
import torch

__all__ = ['allow_mmengine_checkpoint_globals', 'mmengine_checkpoint_globals']

# numpy dtype kinds whose dtype objects may be rebuilt: bool, ints, floats, complex, str, bytes, dates.
_SAFE_DTYPE_KINDS = frozenset('biufcUSMm')
_registered = False


def _history_buffer_class() -> type:
    from mmengine.logging.history_buffer import HistoryBuffer
    return HistoryBuffer


def history_buffer_getattr(obj: Any, name: str) -> Callable:
    """``getattr`` limited to what a pickled HistoryBuffer needs: a public method of its class."""
    history_buffer = _history_buffer_class()
    if (isinstance(obj, type) and issubclass(obj, history_buffer) and isinstance(name, str)
            and not name.startswith('_') and callable(getattr(obj, name, None))):
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'weights_only load refused getattr({obj!r}, {name!r}): mmppma only allows HistoryBuffer methods '
        'here. If you trust this file, load it with torch.load(path, weights_only=False).')


def _numpy_multiarray() -> Any:
    core = getattr(np, '_core', None)  # numpy >= 2
    return core.multiarray if core is not None else np.core.multiarray


def mmengine_checkpoint_globals() -> List[Union[Callable, Tuple[Callable, str]]]:
    """The allowlist entries for :func:`torch.serialization.add_safe_globals`."""
    multiarray = _numpy_multiarray()
    entries: List[Union[Callable, Tuple[Callable, str]]] = [_history_buffer_class(), np.ndarray, np.dtype]
    # numpy 2 pickles as numpy._core.multiarray.*, numpy 1 as numpy.core.multiarray.*: accept both.
    for module in ('numpy._core.multiarray', 'numpy.core.multiarray'):
        entries += [(multiarray._reconstruct, f'{module}._reconstruct'), (multiarray.scalar, f'{module}.scalar')]
    dtype_classes = {type(np.dtype(t)) for t in set(np.sctypeDict.values()) if np.dtype(t).kind in _SAFE_DTYPE_KINDS}
    entries += sorted(dtype_classes, key=lambda cls: cls.__qualname__)
    entries.append((history_buffer_getattr, f'{builtins.__name__}.getattr'))
    return entries


def allow_mmengine_checkpoint_globals() -> None:
    """Allowlist the globals of mmengine checkpoints for ``torch.load(weights_only=True)``. Idempotent.

    Called by ``import mmppma``; a no-op on torch without ``add_safe_globals`` (< 2.4), where the
    default is still ``weights_only=False``.
    """
    global _registered
    if _registered or not hasattr(torch.serialization, 'add_safe_globals'):
        return
    torch.serialization.add_safe_globals(mmengine_checkpoint_globals())
    _registered = True
