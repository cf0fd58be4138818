"""Labels (an extension dstack lacks): what hosts carry and runs require.

An SSH fleet's host entry may give `labels: {rack: r1, zone: a, near: [nfs-a, nfs-b]}` (a value
or a list of values); a run gives `labels: {rack: r1}` (all must match) and `near: nfs-a` (a
preference). `dstack plan/apply --label KEY=VALUE` adds to every run's `labels` for that
invocation (`config/label_options.py`).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

from dstack_plan.config.described import Described

GPU_MODEL = "gpu.model"
"""The label every host has when it has GPUs: their normalised model (`A100`, `RTX4090`)."""
NEAR = "near"
"""The label a run's `near:` looks for on hosts."""
ZONE = "zone"
"""The availability zone a cloud machine runs in: built in on cloud fleets, where a run
mounting a network volume must go to the volume's zone."""

KEY_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$"
VALUE_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._:/-]{0,61}[A-Za-z0-9])?$"
_KEY_RE = re.compile(KEY_PATTERN)
_VALUE_RE = re.compile(VALUE_PATTERN)


def check_key(key: str) -> str:
    """`key` if it is a label key: 1-63 letters, digits, `.`, `_`, `/`, `-`, alphanumeric at
    both ends; else ValueError saying so."""
    if not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"invalid label key {key!r}: use 1-63 letters, digits, '.', '_', '/' or '-', "
            "starting and ending with a letter or digit"
        )
    return key


def check_value(key: str, value: str) -> str:
    """`value` if it is a label value (as a key, and `:` too); else ValueError naming `key`."""
    if not _VALUE_RE.fullmatch(value):
        raise ValueError(
            f"invalid value {value!r} of label {key!r}: use 1-63 letters, digits, '.', '_', "
            "':', '/' or '-', starting and ending with a letter or digit"
        )
    return value


def _run_labels(value: dict[str, str]) -> dict[str, str]:
    for key, item in value.items():
        check_value(check_key(key), item)
    return value


def _host_labels(value: dict[str, str | tuple[str, ...]]) -> dict[str, str | tuple[str, ...]]:
    for key, item in value.items():
        check_key(key)
        if key == GPU_MODEL:
            raise ValueError(f"{GPU_MODEL!r} is built in: it is the model of the host's GPUs")
        items = (item,) if isinstance(item, str) else item
        if not items:
            raise ValueError(f"label {key!r} lists no value")
        for one in items:
            check_value(key, one)
    return value


def _near(value: str) -> str:
    return check_value(NEAR, value)


_KEY_SCHEMA = {"type": "string", "pattern": KEY_PATTERN}
_VALUE_SCHEMA = {"type": "string", "pattern": VALUE_PATTERN}

RunLabels = Annotated[
    dict[str, str],
    AfterValidator(_run_labels),
    Described("a mapping of label keys to values, such as {rack: r1}"),
    WithJsonSchema(
        {"type": "object", "propertyNames": _KEY_SCHEMA, "additionalProperties": _VALUE_SCHEMA}
    ),
]
"""A run's `labels:`: every host it runs on must carry each of them."""

HostLabelValues = Annotated[
    dict[str, str | tuple[str, ...]],
    AfterValidator(_host_labels),
    Described("a mapping of label keys to a value or a list of values, such as {rack: r1}"),
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": _KEY_SCHEMA,
            "additionalProperties": {
                "anyOf": [_VALUE_SCHEMA, {"type": "array", "items": _VALUE_SCHEMA, "minItems": 1}]
            },
        }
    ),
]
"""An SSH host entry's `labels:`; a list means the host carries each value (`near`)."""

Near = Annotated[
    str,
    AfterValidator(_near),
    Described("a storage name such as nfs-a"),
    WithJsonSchema(_VALUE_SCHEMA),
]
"""A run's `near:`: prefer hosts whose `near` label gives this name."""
