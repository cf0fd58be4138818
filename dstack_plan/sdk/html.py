"""Small HTML tables for notebooks (`_repr_html_`): a run with its jobs, a plan's changes.
Every value is escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dstack_plan.inspect.runs import RunView
    from dstack_plan.plan.model import Plan


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], caption: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape('' if v is None else str(v))}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return (
        f"<table><caption>{escape(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def run_table(view: RunView) -> str:
    """The run's status line and one row per job."""
    caption = f"{view.address}: {view.status}" + (f" ({view.error})" if view.error else "")
    rows = [(j.id, j.status, j.exit_code, j.host, j.termination_reason) for j in view.jobs]
    return _table(("job", "status", "exit code", "host", "reason"), rows, caption)


def plan_table(plan: Plan) -> str:
    """One row per change: action, address, reason, where it goes."""
    rows = [
        (
            c.action.value,
            c.address,
            c.reason or "",
            c.placement.fleet if c.placement else "",
        )
        for c in plan.changes
    ]
    return _table(("action", "address", "reason", "fleet"), rows, plan.summary())
