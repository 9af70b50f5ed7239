"""Argument checks shared across mmppma: a bad choice raises a ``ValueError`` that lists the valid ones."""
from typing import Any, Sequence


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """Raise ``ValueError`` naming ``name``, ``value`` and the valid ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f'{name}={value!r} is not supported; choose one of {", ".join(map(repr, choices))}')

