"""The types of the variables and functions a rule sees (documented in docs/policies.md).

`variables.py` builds the values; a unit test checks every value against these types, so the
field check and the values cannot drift apart.
"""

from __future__ import annotations

from dstack_plan.policy.cel_check import (
    BOOL,
    DOUBLE,
    DYN,
    INT,
    STRING,
    Function,
    ListOf,
    MapOf,
    Record,
    Type,
)

STRINGS = ListOf(STRING)

ADDRESS = Record("a resource", {"address": STRING, "kind": STRING, "name": STRING})

CHANGE = Record(
    "a change",
    {
        "address": STRING,
        "kind": STRING,
        "name": STRING,
        "provider": STRING,
        "action": STRING,
        "reason": DYN,  # a string, or null
        "before": DYN,  # the normalised spec in state, or null for a create
        "after": DYN,  # the normalised desired spec, or null for a delete
        "changed_paths": STRINGS,
        "replace_paths": STRINGS,
    },
)

RUN = Record(
    "a run",
    {
        "address": STRING,
        "kind": STRING,
        "name": STRING,
        "action": STRING,
        "gpus": DOUBLE,
        "gpus_per_job": DOUBLE,
        "jobs": INT,
        "image": STRING,
        "registry": STRING,
        "labels": MapOf(STRING),
        "namespace": STRING,
        "fleet": STRING,
        "price_per_hour": DOUBLE,
    },
)

_RESOURCE_CHANGE = Record(
    "a plan resource change",
    {
        "address": STRING,
        "type": STRING,
        "name": STRING,
        "provider_name": STRING,
        "change": Record(
            "a plan change",
            {
                "actions": STRINGS,
                "before": DYN,
                "after": DYN,
                "changed_paths": ListOf(STRINGS),
                "replace_paths": ListOf(STRINGS),
                "sensitive_secrets": STRINGS,
            },
        ),
        "action_reason": DYN,
        "reason": DYN,
        "depends_on": STRINGS,
        "submitted": DYN,  # true / false: how apply records it; null: as recorded now
        "placement": DYN,  # a placement record, or null
    },
)

PLAN = Record(
    "the JSON plan",
    {
        "format_version": STRING,
        "applyable": BOOL,
        "complete": BOOL,
        "destroy": BOOL,
        "prior_state": Record("prior_state", {"lineage": STRING, "serial": INT}),
        "resource_changes": ListOf(_RESOURCE_CHANGE),
        "summary": Record("summary", {"add": INT, "change": INT, "destroy": INT}),
        "cost": Record(
            "the plan's cost",
            {"currency": STRING, "period": STRING, "before": DOUBLE, "after": DOUBLE},
        ),
        "targets": STRINGS,
        "replace": STRINGS,
        "warnings": STRINGS,
        "submission": BOOL,
        "kept_submitted": STRINGS,
    },
)

VARIABLES: dict[str, Type] = {
    "plan": PLAN,
    "changes": ListOf(CHANGE),
    "runs": ListOf(RUN),
    "cost": Record("cost", {"before": DOUBLE, "after": DOUBLE, "delta": DOUBLE}),
    "gpus": Record("gpus", {"total": DOUBLE, "by_namespace": MapOf(DOUBLE)}),
    "summary": Record("summary", {"add": INT, "change": INT, "destroy": INT}),
    "deletions": ListOf(ADDRESS),
    "replacements": ListOf(ADDRESS),
}

FUNCTIONS: dict[str, Function] = {
    name: Function(1, STRINGS) for name in ("created", "updated", "replaced", "deleted")
}
