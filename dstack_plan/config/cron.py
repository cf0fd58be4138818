"""`schedule.cron` expressions as dstack reads them, checked when a configuration loads.

dstack reads cron with APScheduler's `CronTrigger.from_crontab`: five fields, UTC, weekday
numbers counted from Monday (`0` is Monday, `6` is Sunday, `7` is an error; names mean what
they say). `posix_cron` rewrites the weekday field into the POSIX numbering croniter uses, so
`dstack_plan/runs/schedule.py` computes fire times the way dstack did.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"\d+")


def posix_cron(expr: str) -> str:
    """`expr` with its weekday field in croniter's numbering (0 or 7 = Sunday); ValueError
    naming the expression when it does not have five fields or a weekday is out of range."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"invalid cron expression {expr!r}: expected 5 fields")
    fields[4] = ",".join(_weekday_item(item, expr) for item in fields[4].split(","))
    return " ".join(fields)


def check_cron(expr: str) -> None:
    """ValueError naming `expr` when croniter cannot read it (after `posix_cron`)."""
    from croniter import croniter  # only configurations with a schedule pay for it

    posix = posix_cron(expr)
    try:
        croniter(posix, day_or=False)
    except (ValueError, KeyError) as e:  # croniter's errors subclass ValueError
        raise ValueError(f"invalid cron expression {expr!r}: {e}") from None


def _weekday_item(item: str, expr: str) -> str:
    """One comma-separated item of a Monday-based weekday field, Sunday-based: every number
    moves up by one (Sunday becomes 7, which croniter accepts), and an open start (`*/2`,
    `3/2`) gets the explicit end 7 that it had (6, Sunday) before."""
    value, slash, step = item.partition("/")
    if slash and value == "*":
        value = "0-6"
    elif slash and "-" not in value:
        value = f"{value}-6"

    def shift(match: re.Match[str]) -> str:
        day = int(match.group())
        if day > 6:
            raise ValueError(
                f"invalid cron expression {expr!r}: weekday {day} (0 is Monday, 6 is Sunday)"
            )
        return str(day + 1)

    return _NUMBER.sub(shift, value) + (f"/{step}" if slash else "")
