"""`dstack schema`: print the JSON Schema of a kind, or of any configuration."""

from __future__ import annotations

import typer


def schema(
    kind: str = typer.Argument(
        None,
        help="task, service, dev-environment, fleet, volume, gateway or policy (a policy "
        "file); every configuration kind when omitted.",
    ),
) -> None:
    """Print the JSON Schema editors use to autocomplete and check configurations."""
    from dstack_plan.cli.output import print_json
    from dstack_plan.config.schema import KINDS, kind_schema, union_schema
    from dstack_plan.errors import DstackPlanError

    if kind == "policy":
        from dstack_plan.policy.model import policy_file_schema

        print_json(policy_file_schema())
        return
    if kind is None:
        print_json(union_schema())
        return
    if kind not in KINDS:
        raise DstackPlanError(f"unknown kind {kind!r}: choose one of {', '.join(KINDS)}, policy")
    print_json(kind_schema(kind))
