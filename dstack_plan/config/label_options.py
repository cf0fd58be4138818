"""`--label KEY=VALUE`: read, and added to every run's `labels:` for that invocation, as
dstack's `--gpu`-style flags override a configuration (so the plan, a saved plan and state
hold them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.labels import check_key, check_value
from dstack_plan.config.resource import Desired, Resource
from dstack_plan.config.runs import RunSpec


def parse_label(text: str) -> tuple[str, str]:
    """`KEY=VALUE` (a `--label` option) as a pair; ValueError saying what is wrong."""
    key, equals, value = text.partition("=")
    if not equals:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    key, value = key.strip(), value.strip()
    return check_key(key), check_value(key, value)


def with_run_labels(desired: Desired, labels: Mapping[str, str]) -> Desired:
    """`desired` with `labels` added to every run's `labels:` (a label the file
    gives too takes the value of `labels`): what the plan, its saved file and state hold."""
    if not labels:
        return desired
    resources: dict[str, Resource] = {}
    for address, resource in desired.resources.items():
        if resource.kind in RUN_KINDS and isinstance(resource.spec, RunSpec):
            merged = {**(resource.spec.labels or {}), **labels}
            spec = resource.spec.model_copy(update={"labels": merged})
            resource = dataclasses.replace(resource, spec=spec)
        resources[address] = resource
    return dataclasses.replace(desired, resources=resources)
