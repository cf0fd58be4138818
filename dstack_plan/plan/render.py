"""Terraform-style rendering of a plan for people (the JSON form is plan/json_plan.py), as styled
lines: `dstack plan` and `dstack apply` print them, the web UI's plan page shows them."""

from __future__ import annotations

from typing import Any

from dstack_plan.plan.lines import Line, Part, styled
from dstack_plan.plan.list_diff import Element, Entry, Hidden, list_diff, value_text
from dstack_plan.plan.model import Action, Placement, Plan, ResourceChange
from dstack_plan.plan.normalize import flatten, spec_from_normalized

_HEADERS = {
    Action.CREATE: "will be created",
    Action.UPDATE: "will be updated in-place",
    Action.DELETE_THEN_CREATE: "must be replaced",
    Action.CREATE_THEN_DELETE: "must be replaced",
    Action.DELETE: "will be destroyed",
}
_COLORS = {
    Action.CREATE: "green",
    Action.UPDATE: "yellow",
    Action.DELETE_THEN_CREATE: "red",
    Action.CREATE_THEN_DELETE: "red",
    Action.DELETE: "red",
}
_LEGEND = {
    Action.CREATE: "create",
    Action.UPDATE: "update in-place",
    Action.DELETE: "destroy",
    Action.DELETE_THEN_CREATE: "destroy and then create replacement",
    Action.CREATE_THEN_DELETE: "create replacement and then destroy",
}


def render_plan(plan: Plan) -> list[Line]:
    """The plan as lines (for `cli.output.print_lines`, or the web UI's plan page)."""
    lines: list[Line] = []
    for warning in plan.warnings:
        lines += [(styled("Warning:", "yellow"), f" {warning}"), ""]
    active = [c for c in plan.changes if c.action is not Action.NOOP]
    if not active:
        message = (
            "No objects need to be destroyed."
            if plan.destroy
            else ("Your infrastructure matches the configuration.")
        )
        lines.append((styled("No changes.", "green"), f" {message}"))
        lines += _noop_notes(plan)
        lines += ownership_notes(plan)
        return lines
    used = [a for a in _LEGEND if any(c.action is a for c in active)]
    lines.append("Resource actions are indicated with the following symbols:")
    for action in used:
        lines.append(("  ", styled(f"{action.symbol:>3}", _COLORS[action]), f" {_LEGEND[action]}"))
    lines += ["", "dstack-plan will perform the following actions:", ""]
    for change in active:
        lines += _render_change(change)
        lines.append("")
    lines += _noop_notes(plan)
    lines += ownership_notes(plan)
    lines.append((styled(plan.summary(), "bold"),))
    lines.append(f"Estimated cost: ${plan.cost.before:.2f}/h -> ${plan.cost.after:.2f}/h")
    return lines


NOOP_LINES = 20
"""Unchanged runs are listed a line each up to this many; more are summed up by fleet (a
no-op plan of 10,000 runs would print 10,000 lines; Terraform's prints none). Those that
wait for room or cannot be placed are always listed."""


def _noop_notes(plan: Plan) -> list[Line]:
    kept = [c for c in plan.changes if c.action is Action.NOOP and c.placement is not None]
    if len(kept) <= NOOP_LINES:
        notes = [f"  {c.address}: no changes ({_placement(c)})" for c in kept]
        return [*notes, ""] if notes else []
    waiting = [
        c for c in kept if c.placement and (c.placement.pending or c.placement.placed is False)
    ]
    notes = [f"  {c.address}: no changes ({_placement(c)})" for c in waiting[:NOOP_LINES]]
    if len(waiting) > NOOP_LINES:
        notes.append(f"  ... and {len(waiting) - NOOP_LINES:,} more waiting for room")
    notes.append(
        f"  {len(kept):,} runs without changes (where each one is: `dstack plan --json`):"
    )
    by_fleet: dict[tuple[str, str], list[Placement]] = {}
    for change in kept:
        assert change.placement is not None
        placement = change.placement
        by_fleet.setdefault((placement.fleet, placement.provider), []).append(placement)
    for (fleet, provider), placements in by_fleet.items():
        hosts = sorted({h for p in placements for h in p.hosts})
        on = ", ".join(hosts) if len(hosts) <= 3 else f"{len(hosts):,} hosts"
        price = sum(p.price_per_hour for p in placements)
        notes.append(
            f"    fleet {fleet} ({provider}): {len(placements):,} on {on or '-'}, ${price:.2f}/h"
        )
    return [*notes, ""]


def ownership_notes(plan: Plan) -> list[Line]:
    """What a plan keeps or adopts because of submissions (`apply -f`, the SDK)."""
    lines: list[Line] = []
    declared = [c.address for c in plan.changes if c.origin_only]
    if declared:
        lines.append(
            f"{_counted(len(declared), 'submitted resource')} now declared by the files "
            f"(deleting {'it' if len(declared) == 1 else 'one'} from them later destroys it): "
            f"{', '.join(declared)}"
        )
    if plan.kept:
        lines.append(
            f"{_counted(len(plan.kept), 'submitted resource')} kept (not in the files): "
            f"{', '.join(plan.kept)}; `dstack delete NAME` or `apply --prune` removes them"
        )
    if plan.submission and not plan.destroy:
        lines.append("A submission (-f): what else the project's state holds is left as it is.")
    return [*lines, ""] if lines else []


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _render_change(change: ResourceChange) -> list[Line]:
    color = _COLORS[change.action]
    header = f"  # {change.address} {_header(change)}"
    if change.action_reason in _REASON_HEADERS:
        pass
    elif change.action is Action.DELETE and change.reason:
        header += f"\n  # (because {change.reason})"
    elif change.reason and change.action is not Action.UPDATE:
        header += f" ({change.reason})"
    lines: list[Line] = [(styled(header, "bold"),)]
    symbol = styled(f"{change.action.symbol:>3}", color)
    lines.append((symbol, f' {change.kind} "{change.name}" {{'))
    if change.action is Action.CREATE and change.before is None:
        lines += _attributes("+", "green", change.after or {}, change)
    elif change.action is Action.DELETE:
        lines += _attributes("-", "red", change.before or {}, change)
    else:
        lines += _changed_attributes(change)
    lines.append("    }")
    if change.placement is not None:
        lines.append(("    ", styled("placement:", "cyan"), f" {_placement(change)}"))
    return lines


_REASON_HEADERS = {
    "replace_by_request": "will be replaced, as requested",
    "replace_because_tainted": "is tainted, so must be replaced",
    "update_rolling": "will be updated in-place, rolling: one replica at a time",
}


def _header(change: ResourceChange) -> str:
    return _REASON_HEADERS.get(change.action_reason or "", _HEADERS[change.action])


def _placement(change: ResourceChange) -> str:
    p = change.placement
    assert p is not None
    where = f"fleet {p.fleet} ({p.provider})"
    if p.hosts:
        where += " on " + ", ".join(p.hosts)
    where += f", ${p.price_per_hour:.2f}/h"
    if p.note:
        where += f" — {p.note}"
    return where


def _attributes(sym: str, color: str, spec: dict[str, Any], change: ResourceChange) -> list[Line]:
    flat = {k: v for k, v in flatten(_shown(change.kind, spec)).items() if v not in ({}, [], None)}
    width = max((len(k) for k in flat), default=0)
    return [
        ("      ", styled(sym, color), f" {key:<{width}} = {value_text(value)}")
        for key, value in flat.items()
    ]


def _shown(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """`type`, `name`, `resources` and whatever differs from the kind's defaults."""
    try:
        explicit = spec_from_normalized(kind, spec).model_dump(
            mode="json", exclude_defaults=True, exclude_none=True
        )
    except ValueError:  # a spec from an older version: show it whole
        return spec
    head = {k: spec[k] for k in ("type", "name", "resources") if k in spec}
    return head | {k: v for k, v in explicit.items() if k not in head}


def _changed_attributes(change: ResourceChange) -> list[Line]:
    before = flatten(change.before or {})
    after = flatten(change.after or {})
    paths = list(change.changed_paths)
    width = max((len(p) for p in paths), default=0)
    lines: list[Line] = []
    for path in paths:
        forced: tuple[Part, ...] = ()
        if path in change.replace_paths:
            forced = (" ", styled("# forces replacement", "red"))
        entries = list_diff(change.kind, path, change.before or {}, change.after or {})
        if entries is not None:
            lines.append(("      ", styled("~", "yellow"), f" {path:<{width}} = [", *forced))
            lines += _list_entries(entries)
            lines.append("        ]")
            continue
        values = f"{value_text(before.get(path))} -> {value_text(after.get(path))}"
        line: tuple[Part, ...] = ("      ", styled("~", "yellow"), f" {path:<{width}} = {values}")
        lines.append(line + forced)
    hidden = len(set(before) | set(after)) - len(paths)
    if hidden > 0:
        lines.append(f"        # ({hidden} unchanged attributes hidden)")
    return lines


_SIGN_COLORS = {"+": "green", "-": "red", "~": "yellow"}


def _sign(sign: str) -> Part:
    return styled(sign, _SIGN_COLORS[sign]) if sign else " "


def _list_entries(entries: tuple[Entry, ...]) -> list[Line]:
    """A changed list's elements (`plan.list_diff`), inside its `[` and `]` lines."""
    lines: list[Line] = []
    for entry in entries:
        if isinstance(entry, Hidden):
            lines.append(f"            {entry.text}")
        elif not entry.mapping:
            lines.append(("          ", _sign(entry.sign), f" {value_text(entry.value)},"))
        else:
            lines.append(("          ", _sign(entry.sign), " {"))
            lines += _element_fields(entry)
            lines.append("            },")
    return lines


def _element_fields(element: Element) -> list[Line]:
    width = max(len(f.key) for f in element.fields)
    lines: list[Line] = []
    for field in element.fields:
        value = value_text(field.old if field.sign == "-" else field.new)
        if field.sign == "~":
            value = f"{value_text(field.old)} -> {value}"
        lines.append(("              ", _sign(field.sign), f" {field.key:<{width}} = {value}"))
    if element.hidden:
        lines.append(f"                {Hidden(element.hidden, 'attribute').text}")
    return lines
