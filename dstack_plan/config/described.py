"""How error messages name what a field takes (`Described`). A leaf of `config/`: the units
grammar, the annotation reader (`introspect`) and the shared base models all use it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Described:
    """How error messages name what a field takes, for types whose Python type says too little.

    Put it in a type's `Annotated[...]` metadata, or as a model's `_described` class variable.
    `one` follows "expected" (`a port such as 8080 or "8080:80"`); `many` follows "a list of".
    """

    one: str
    many: str | None = None
