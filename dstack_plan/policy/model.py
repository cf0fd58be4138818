"""Policy files and their rules. The outcome of checking a plan against them (`PolicyReport`,
`RuleResult`) lives in `dstack_plan.plan.policy_report`, beside the plan that records it."""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import Field

from dstack_plan.config.base import Strict
from dstack_plan.plan.policy_report import Severity


class Rule(Strict):
    """One rule of a policy file: `expression` (CEL) must be true for the plan to pass."""

    name: str = Field(min_length=1, max_length=128)
    expression: str = Field(min_length=1)
    message: str = Field(min_length=1)
    """Printed (and recorded) when the expression is false."""
    severity: Severity = "deny"
    """`deny`: a failure fails the plan (exit 1); `warn`: it is printed, the exit code stays."""


class PolicyFile(Strict):
    """The content of a policy file: `rules:`, a list of rules."""

    rules: list[Rule] = Field(min_length=1)


def policy_file_schema() -> dict[str, Any]:
    """The JSON Schema of a policy file (`schemas/policy.schema.json`, `dstack schema policy`),
    for editors; expressions themselves are checked by `dstack validate`."""
    from dstack_plan.config.schema import SCHEMA_DIALECT  # noqa: PLC0415 - schema output only

    schema = PolicyFile.model_json_schema(mode="validation")
    return {"$schema": SCHEMA_DIALECT, "$id": "policy.schema.json", **schema}


class Where(NamedTuple):
    """Where a rule's expression starts in its file, to locate errors inside it."""

    line: int
    """1-based line of the expression's first character."""
    column: int
    """1-based column of that character."""
    block: bool
    """A block scalar (`|`, `>`): the expression's own lines follow the indicator's line."""


class LoadedRule(NamedTuple):
    rule: Rule
    file: str
    """The policy file as the user named it (relative to the project when found there)."""
    where: Where

    def position(self, offset: int) -> tuple[int, int]:
        """(line, column) in the file of character `offset` of the expression."""
        before = self.rule.expression[:offset]
        lines = before.count("\n")
        last = before.rsplit("\n", 1)[-1]
        if self.where.block:
            return self.where.line + lines, self.where.column + len(last)
        if lines == 0:
            return self.where.line, self.where.column + len(last)
        return self.where.line + lines, len(last) + 1
