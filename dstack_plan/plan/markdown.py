"""The plan as a compact Markdown comment for a pull or merge request.

Rendered from the JSON plan (`json_plan.plan_to_json`), never from the `Plan` model, so the
comment shows exactly what `dstack plan --json` shows. Pure: a dict in, a string out.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from dstack_plan.plan.markdown_diff import diff_block
from dstack_plan.plan.markdown_escape import code as _code
from dstack_plan.plan.markdown_escape import text as _text

MARKER = "<!-- dstack-plan -->"
"""First line of every comment: CI finds its earlier comment by it and edits that one."""
MAX_CHARS = 65_000
"""GitHub refuses a comment longer than 65,536 characters (GitLab: 1,000,000)."""


class _Group(NamedTuple):
    title: str
    actions: tuple[tuple[str, ...], ...]


_GROUPS = (
    _Group("Create", (("create",),)),
    _Group("Update in place", (("update",),)),
    _Group("Replace", (("delete", "create"), ("create", "delete"))),
    _Group("Destroy", (("delete",),)),
)
_NOOP = ("no-op",)


def render_markdown(document: dict[str, Any], max_chars: int = MAX_CHARS) -> str:
    """The JSON plan `document` as Markdown: summary, cost, policy outcomes, the changes by
    action with reasons and placements, pending runs; secrets shown as `(sensitive)`.

    Longer than `max_chars`, it leaves out the attribute diffs, then cuts the lists (saying
    so): the summary, the cost and the policy outcomes always come first."""
    try:
        text = _render(document, diffs=_Budget(max_chars))
        if len(text) <= max_chars:
            return text
    except _TooLong:
        pass  # diffs of a large plan are slow to make: stop at the limit, not at the end
    note = (
        f"> Attribute diffs are left out: with them this comment would be longer than "
        f"{max_chars:,} characters. The job's `dstack plan` output shows them."
    )
    text = _render(document, diffs=None, note=note)
    return text if len(text) <= max_chars else _cut(text, max_chars)


class _TooLong(Exception):
    pass


class _Budget:
    """Characters left for the diffs; running out raises `_TooLong`."""

    def __init__(self, chars: int) -> None:
        self.left = chars

    def spend(self, lines: list[str]) -> list[str]:
        self.left -= sum(len(line) + 1 for line in lines)
        if self.left < 0:
            raise _TooLong
        return lines


def _render(document: dict[str, Any], diffs: _Budget | None, note: str | None = None) -> str:
    changes: list[dict[str, Any]] = document.get("resource_changes", [])
    lines = [MARKER, f"### {_title(document)}", ""]
    lines += [_summary(document, changes), "", _cost(document.get("cost") or {}), ""]
    if note:
        lines += [note, ""]
    if not document.get("complete", True):
        targets = ", ".join(_code(t) for t in document.get("targets", []))
        lines += [f"> Targeted plan ({targets}): changes outside the targets are not shown.", ""]
    for warning in document.get("warnings", []):
        lines += [f"> **Warning:** {_text(warning)}", ""]
    if document.get("policy"):
        lines += _policy(document["policy"])
    known = {a for group in _GROUPS for a in group.actions} | {_NOOP}
    for group in _GROUPS:
        chosen = [c for c in changes if _actions(c) in group.actions]
        lines += _group(group.title, chosen, diffs)
    lines += _group("Other", [c for c in changes if _actions(c) not in known], diffs)
    lines += _pending(changes)
    unchanged = sum(1 for c in changes if _actions(c) == _NOOP)
    if unchanged:
        noun = "resource" if unchanged == 1 else "resources"
        lines += [f"{unchanged} unchanged {noun} not shown.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _cut(text: str, max_chars: int) -> str:
    """`text` cut at a line boundary to fit `max_chars` with the line that says so."""
    lines = text.splitlines()
    kept: list[str] = []
    size = 0
    budget = max_chars - 300  # room for the closing tag and the notice
    for line in lines:
        if size + len(line) + 1 > budget:
            break
        kept.append(line)
        size += len(line) + 1
    if sum(line.startswith("<details>") for line in kept) > kept.count("</details>"):
        kept.append("</details>")
    left = len(lines) - len(kept)
    kept += ["", f"**… {left:,} more lines cut to fit {max_chars:,} characters: "
             "the job's `dstack plan` output has the whole plan.**"]  # fmt: skip
    return "\n".join(kept) + "\n"


def _title(document: dict[str, Any]) -> str:
    policy = document.get("policy") or {}
    if policy.get("denied"):
        return "dstack plan: denied by policy"
    return "dstack plan (destroy)" if document.get("destroy") else "dstack plan"


def _summary(document: dict[str, Any], changes: list[dict[str, Any]]) -> str:
    if not any(_actions(c) != _NOOP for c in changes):
        if document.get("destroy"):
            return "**No changes.** No objects need to be destroyed."
        return "**No changes.** Your infrastructure matches the configuration."
    s = document.get("summary") or {}
    add, change, destroy = s.get("add", 0), s.get("change", 0), s.get("destroy", 0)
    return f"**Plan: {add} to add, {change} to change, {destroy} to destroy.**"


def _cost(cost: dict[str, Any]) -> str:
    before, after = float(cost.get("before") or 0.0), float(cost.get("after") or 0.0)
    delta = after - before
    sign = "+" if delta >= 0 else "-"
    return f"Estimated cost: ${before:.2f}/h → ${after:.2f}/h ({sign}${abs(delta):.2f}/h)"


def _policy(policy: dict[str, Any]) -> list[str]:
    rules: list[dict[str, Any]] = policy.get("rules", [])
    failed = [r for r in rules if r.get("outcome") != "pass"]
    passed = [r for r in rules if r.get("outcome") == "pass"]
    verdict = "❌ denied" if policy.get("denied") else "✅ passed"
    if failed and not policy.get("denied"):
        verdict = "⚠️ passed with warnings"
    lines = [f"#### Policy: {verdict} ({len(passed)} of {len(rules)} rules passed)", ""]
    if failed:
        lines += ["| rule | severity | outcome | message |", "|---|---|---|---|"]
        for rule in failed:
            mark = "❌ fail" if rule.get("severity") == "deny" else "⚠️ warn"
            lines.append(
                f"| {_rule_name(rule)} | {_text(rule.get('severity', ''))} | {mark} "
                f"| {_text(rule.get('message') or '')} |"
            )
        lines.append("")
    if passed:
        names = ", ".join(_rule_name(r) for r in passed)
        lines += [f"<details><summary>{len(passed)} passed</summary>", "", names, "</details>", ""]
    return lines


def _rule_name(rule: dict[str, Any]) -> str:
    name = _code(str(rule.get("name", "?")))
    return f"{name} ({_code(str(rule['file']))})" if rule.get("file") else name


def _group(title: str, changes: list[dict[str, Any]], diffs: _Budget | None) -> list[str]:
    if not changes:
        return []
    lines = [f"#### {title} ({len(changes)})", ""]
    lines += ["| resource | why | placement | $/h |", "|---|---|---|---|"]
    for c in changes:
        lines.append(
            f"| {_code(c['address'])} | {_why(c)} | {_placement(c.get('placement'))} "
            f"| {_price(c.get('placement'))} |"
        )
    lines.append("")
    if diffs is not None:
        diffs.spend(lines)
        for c in changes:
            lines += diffs.spend(diff_block(c))
    return lines


def _why(change: dict[str, Any]) -> str:
    reason = _text(change.get("reason") or "")
    if _actions(change) == ("create", "delete"):
        reason = f"{reason} (create before destroy)".strip()
    return reason or "—"


def _placement(placement: dict[str, Any] | None) -> str:
    if placement is None:
        return "—"
    where = f"{_code(placement['fleet'])} ({_text(placement.get('provider', ''))})"
    if placement.get("hosts"):
        where += " on " + ", ".join(_code(h) for h in placement["hosts"])
    elif placement.get("placed") is None:
        where += ", machines known after apply"
    if placement.get("pending"):
        where += " · ⏳ pending"
    elif placement.get("placed") is False:
        where += " · ⚠️ cannot be placed"
    return where


def _price(placement: dict[str, Any] | None) -> str:
    return "—" if placement is None else f"${float(placement.get('price_per_hour', 0)):.2f}"


def _pending(changes: list[dict[str, Any]]) -> list[str]:
    waiting = [c for c in changes if _waits(c.get("placement"))]
    if not waiting:
        return []
    lines = [f"#### Pending placements ({len(waiting)})", ""]
    for c in waiting:
        p = c["placement"]
        label = "pending" if p.get("pending") else "cannot be placed"
        note = str(p.get("note") or label)
        if not note.startswith(label):  # planner notes often say it already
            note = f"{label}: {note}"
        lines.append(f"- {_code(c['address'])}: {_text(note)}")
    return [*lines, ""]


def _waits(placement: dict[str, Any] | None) -> bool:
    if not placement:
        return False
    return bool(placement.get("pending") or placement.get("placed") is False)


def _actions(change: dict[str, Any]) -> tuple[str, ...]:
    return tuple((change.get("change") or {}).get("actions", ()))
