"""The `python:` field of runs and replica groups: a Python version of dstack's base image."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, WithJsonSchema

from dstack_plan.config.units import describe

__all__ = ["PYTHON_VERSIONS", "PythonVersion", "parse_python_version"]

PYTHON_VERSIONS = ("3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15")
"""The versions dstack 0.22.5 accepts, in order."""


def parse_python_version(value: Any) -> Any:
    """Return `value` as a version string; YAML numbers (`python: 3.12`) count as text.

    YAML reads `3.10` as the float 3.1, so 3.1 means 3.10, as in dstack. Other non-strings
    are left to the Literal check, whose message names the accepted versions.
    """
    if isinstance(value, float):
        value = repr(value)
        if value == "3.1":
            value = "3.10"
    if isinstance(value, str) and value not in PYTHON_VERSIONS:
        raise ValueError(
            f"unsupported python {describe(value)}: choose one of {', '.join(PYTHON_VERSIONS)}"
        )
    return value


PythonVersion = Annotated[
    Literal["3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15"],
    BeforeValidator(parse_python_version),
    WithJsonSchema({"anyOf": [{"enum": list(PYTHON_VERSIONS)}, {"type": "number"}]}),
]
"""A Python version such as `"3.12"`, also written as the YAML number `3.12`."""
