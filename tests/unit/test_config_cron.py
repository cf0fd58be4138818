"""`schedule.cron` is checked when the configuration loads, as dstack reads it."""

from __future__ import annotations

import pytest

from dstack_plan.config.runs import TaskSpec
from dstack_plan.errors import DstackPlanError


def task(cron: object) -> TaskSpec:
    return TaskSpec.model_validate(
        {"name": "nightly", "commands": ["x"], "schedule": {"cron": cron}}
    )


@pytest.mark.parametrize("cron", ["0 2 * * 1-5", ["*/15 * * * *", "0 0 1 * *"], "0 6 * * 0,6"])
def test_valid_expressions_load(cron: object) -> None:
    assert task(cron).schedule is not None


@pytest.mark.parametrize(
    ("cron", "why"),
    [
        ("0 25 * * *", "invalid cron expression '0 25 * * *'"),
        ("0 2 * * 7", "weekday 7 (0 is Monday, 6 is Sunday)"),
        ("* * * *", "expected 5 fields"),
        ("0 2 * * mon-xyz", "invalid cron expression '0 2 * * mon-xyz'"),
    ],
)
def test_bad_expressions_are_refused_naming_them(cron: str, why: str) -> None:
    with pytest.raises(
        (ValueError, DstackPlanError),
        match=why.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*"),
    ):
        task(cron)
