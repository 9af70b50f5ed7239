"""Keeping the previous release's argument spellings working for one more release, with a DeprecationWarning."""
import functools
import inspect
import warnings
from typing import Callable, Mapping, Optional, Sequence


def renamed_arguments(keywords: Optional[Mapping[str, str]] = None,
                      values: Optional[Mapping[str, Mapping[str, str]]] = None,
                      positional: Sequence[str] = ()) -> Callable[[Callable], Callable]:
    """Decorator: accept the old spellings of a function's arguments, warn, and call it with the new ones.

    keywords: old keyword -> new keyword (e.g. ``{'order': 'form'}``).
    values: new keyword -> {old value: new value} (e.g. ``{'form': {'both': 'release'}}``).
    positional: the names (old spellings) of the arguments that used to be accepted positionally after the
        function's positional parameters, in their old order; they are keyword-only now.
    Each old spelling raises a ``DeprecationWarning`` that names the new one; passing an argument both ways is
    a ``TypeError``.
    """

    keywords, values = dict(keywords or {}), dict(values or {})

    def decorate(func: Callable) -> Callable:
        params = inspect.signature(func).parameters.values()
        n_positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        name = func.__name__

        def warn(what: str) -> None:
            warnings.warn(f'{name}: {what} is deprecated and will be removed in the next release', DeprecationWarning,
                          stacklevel=3)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if len(args) > n_positional:
                extra = args[n_positional:]
                if len(extra) > len(positional):
                    raise TypeError(f'{name}() takes {n_positional} positional arguments but {len(args)} were given')
                args = args[:n_positional]
                for old, value in zip(positional, extra):
                    new = keywords.get(old, old)
                    if old in kwargs or new in kwargs:
                        raise TypeError(f'{name}() got multiple values for argument {new!r}')
                    warn(f'passing {old!r} positionally (pass {new}=... by keyword)')
                    kwargs[new] = value
            for old, new in keywords.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f'{name}() got both {old!r} (deprecated) and {new!r}; pass only {new!r}')
                    warn(f'keyword {old!r} (use {new!r})')
                    kwargs[new] = kwargs.pop(old)
            for key, mapping in values.items():
                value = kwargs.get(key)
                if isinstance(value, str) and value in mapping:
                    warn(f'{key}={value!r} (use {key}={mapping[value]!r})')
                    kwargs[key] = mapping[value]
            return func(*args, **kwargs)

        return wrapper

    return decorate
