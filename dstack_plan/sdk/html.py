"""A run handle's notebook view (`_repr_html_`): the run with its jobs, as an escaped HTML
table (`dstack_plan.plan.html_table`, which also gives `Plan._repr_html_` its table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dstack_plan.plan.html_table import html_table

if TYPE_CHECKING:
    from dstack_plan.inspect.runs import RunView


def run_table(view: RunView) -> str:
    """The run's status line and one row per job."""
    caption = f"{view.address}: {view.status}" + (f" ({view.error})" if view.error else "")
    rows = [(j.id, j.status, j.exit_code, j.host, j.termination_reason) for j in view.jobs]
    return html_table(("job", "status", "exit code", "host", "reason"), rows, caption)
