"""Small HTML tables for notebooks (`_repr_html_`). Every value is escaped. The plan's own
view (`Plan._repr_html_`) uses it, and so do the SDK's run handles (`dstack_plan.sdk.html`)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape


def html_table(header: Sequence[str], rows: Sequence[Sequence[object]], caption: str) -> str:
    """A table with a caption, a header row and one row per item (None shows as empty)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape('' if v is None else str(v))}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return (
        f"<table><caption>{escape(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )
