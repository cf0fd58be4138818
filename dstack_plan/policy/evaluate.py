"""Evaluating rules on a plan with CEL (the `common-expression-language` package).

Why that library (docs/policies.md says more): it is the Rust `cel` crate, which follows the
CEL spec where rules need it (heterogeneous numeric comparison `1 == 1.0`, `gpus <= 8` on a
double; no silent int/double arithmetic), it is maintained, and it costs about 80 ms to
import, paid only when a project has a policy. `cel-python` took about 200 ms (import and
grammar) and got mixed comparisons wrong (`8 >= 7.5` is an error there).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dstack_plan.errors import ConfigError, DstackPlanError
from dstack_plan.plan.policy_report import Outcome, PolicyReport, RuleResult
from dstack_plan.policy.cel_check import Checker, FieldError
from dstack_plan.policy.cel_parse import CelSyntaxError, parse
from dstack_plan.policy.model import LoadedRule
from dstack_plan.policy.schema import FUNCTIONS, VARIABLES
from dstack_plan.policy.variables import plan_functions, plan_values


def load_cel() -> Any:
    """The `cel` module, without its interactive shell (`cel.cli`, which the package's
    `__init__` imports and which pulls in prompt_toolkit: ~65 of its ~85 ms of import)."""
    import sys
    import types

    if "cel" in sys.modules:
        return sys.modules["cel"]
    stub = sys.modules.setdefault("cel.cli", types.ModuleType("cel.cli"))
    try:
        import cel
    except ImportError:  # a version that needs its shell at import: pay for it
        if sys.modules.get("cel.cli") is stub:
            del sys.modules["cel.cli"]
        sys.modules.pop("cel", None)
        import cel
    return cel


class PolicyError(DstackPlanError):
    """A rule could not be evaluated on this plan (it names the rule and its file)."""


_LIBRARY_POSITION = re.compile(r"<input>:(\d+):(\d+): (.*?)(?:\n|$)")


def compile_rules(rules: Sequence[LoadedRule]) -> list[Any]:
    """The compiled program of each rule; ConfigError (FILE:LINE:COL, naming the rule) for a
    syntax error or a name the rule uses that the plan's values do not have."""
    cel = load_cel()

    checker = Checker(VARIABLES, FUNCTIONS)
    programs = []
    issues = []
    for loaded in rules:
        rule = loaded.rule
        try:
            program = cel.compile(rule.expression)
            checker.check(parse(rule.expression))
        except ValueError as e:  # the library's syntax errors, and ours (CelSyntaxError)
            issues.append(_issue(loaded, e))
            continue
        programs.append(program)
    if issues:
        raise ConfigError(issues)
    return programs


def evaluate(rules: Sequence[LoadedRule], document: dict[str, Any]) -> PolicyReport:
    """Check the plan `document` (as `plan_to_json` writes it) against `rules`.

    A rule passes when its expression is true. An expression that cannot be evaluated (a
    missing key in a spec or labels, a type error) or that is not a boolean is a
    PolicyError: a rule that cannot say yes never passes."""
    cel = load_cel()

    programs = compile_rules(rules)
    values = plan_values(document)
    context = cel.Context(variables=values, functions=dict(plan_functions(values)))
    results = []
    for loaded, program in zip(rules, programs, strict=True):
        rule = loaded.rule
        try:
            value = program.execute(context)
        except Exception as e:  # noqa: BLE001 - the library raises many types for eval errors
            raise PolicyError(
                f"{loaded.file}:{loaded.where.line}: rule {rule.name!r} cannot be evaluated "
                "on this plan: "
                f"{_first_line(e)}"
            ) from None
        if not isinstance(value, bool):
            raise PolicyError(
                f"{loaded.file}:{loaded.where.line}: rule {rule.name!r} must give true or false, "
                f"it gave {value!r} ({type(value).__name__})"
            )
        outcome: Outcome = "pass" if value else "fail"
        results.append(
            RuleResult(
                name=rule.name,
                file=loaded.file,
                severity=rule.severity,
                outcome=outcome,
                message=rule.message,
            )
        )
    denied = any(r.outcome == "fail" and r.severity == "deny" for r in results)
    return PolicyReport(rules=tuple(results), denied=denied)


def _issue(loaded: LoadedRule, error: ValueError) -> Any:
    from dstack_plan.errors import ConfigIssue

    rule = loaded.rule
    if isinstance(error, CelSyntaxError):
        offset, message = error.offset, str(error)
        what = "" if isinstance(error, FieldError) else "syntax error: "
    else:
        found = _LIBRARY_POSITION.search(str(error))
        offset = _offset(rule.expression, int(found[1]), int(found[2])) if found else 0
        message = found[3] if found else _first_line(error)
        # the library's own prefix, and its list of every token it could have taken
        message = message.removeprefix("Syntax error: ").split(" expecting {")[0]
        what = "syntax error: "
    line, column = loaded.position(offset)
    return ConfigIssue(loaded.file, line, column, f"rule {rule.name!r}: {what}{message}")


def _offset(text: str, line: int, column: int) -> int:
    """The character offset of 1-based `line`, `column` in `text`."""
    lines = text.split("\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + max(column - 1, 0)


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if isinstance(error, KeyError):
        text = f"no such key {text}"
    return text.splitlines()[0]
