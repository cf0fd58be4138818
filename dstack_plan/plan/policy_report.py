"""The outcome of checking a plan against policy files, as the JSON plan and saved plans
record it. The pure model lives beside the plan, which writes and reads it; `policy/`
(which loads the rules and evaluates them) builds it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Severity = Literal["deny", "warn"]
Outcome = Literal["pass", "fail"]


class RuleResult(BaseModel):
    """A rule's outcome, as the JSON plan's `policy.rules` and saved plans record it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    file: str
    severity: Severity
    outcome: Outcome
    message: str


class PolicyReport(BaseModel):
    """The outcome of checking a plan: each rule's result, and whether the plan is denied."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: tuple[RuleResult, ...] = ()
    denied: bool = False

    def failed(self, severity: Severity) -> list[RuleResult]:
        return [r for r in self.rules if r.outcome == "fail" and r.severity == severity]

    def to_json(self) -> dict[str, Any]:
        """The JSON plan's `policy` section: `{"rules": [...], "denied": bool}`."""
        return {"rules": [r.model_dump() for r in self.rules], "denied": self.denied}
