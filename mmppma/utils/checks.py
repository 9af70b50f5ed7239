"""Argument checks shared across mmppma: a bad choice raises a ``ValueError`` that lists the valid ones, and a
renamed module attribute an ``ImportError`` that names the new one."""
from typing import Any, Callable, Sequence


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise ``ValueError`` naming ``name``, ``value`` and the valid ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f'{name}={value!r} is not supported; choose one of {", ".join(map(repr, choices))}')


def renamed_attributes(module: str, **new_names: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` (its ``__name__``): reading an old name (a key of ``new_names``)
    raises ``ImportError`` naming the new one (its value); any other missing name, the usual ``AttributeError``.
    An ``ImportError``, because ``from module import OLD`` replaces an ``AttributeError`` by its own message."""

    def __getattr__(name: str) -> Any:
        if name in new_names:
            raise ImportError(f'{module}.{name} is now {new_names[name]}')
        raise AttributeError(f'module {module!r} has no attribute {name!r}')

    return __getattr__
