"""Submitting from Python: configurations planned and applied through the same path as
`dstack apply -f` (the state's lock, refresh, plan, apply, state commits). A submission
creates or updates what it is given and nothing else (`plan/submissions.py`): the project's
files are not read, its other resources are left as they are, and what it creates is
recorded as submitted, so a directory apply keeps it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstack_plan.errors import DstackPlanError
from dstack_plan.sdk.builders import Config, Task
from dstack_plan.sdk.loop import run_sync
from dstack_plan.sdk.runs import Run

if TYPE_CHECKING:
    from dstack_plan.apply.report import ApplyReport
    from dstack_plan.config.resource import Resource
    from dstack_plan.plan.model import Plan

LOCK_TIMEOUT = 60.0
"""Seconds a submission waits for another apply or destroy of the same state to finish."""


class ApplyFailed(DstackPlanError):
    """The apply of a submission failed; `report` says what happened to each resource."""

    def __init__(self, report: ApplyReport):
        from dstack_plan.apply.report import ResultStatus

        self.report = report
        failed = [
            f"{r.address}: {r.message}" for r in report.results if r.status == ResultStatus.FAILED
        ]
        super().__init__("apply failed: " + ("; ".join(failed) or "see the report"))


async def aapply(
    configs: Sequence[Config], project: str | Path = ".", *, lock_timeout: float = LOCK_TIMEOUT
) -> Plan:
    """Plan and apply `configs` as a submission (the rest of the project is not touched),
    holding the state's lock; the plan applied. Runs may name fleets, volumes and gateways
    the project's state holds. SpecError for an invalid configuration, ApplyFailed when a
    change failed."""
    return await _apply_resources([c.resource() for c in configs], project, lock_timeout)


async def _apply_resources(
    resources: Sequence[Resource], project: str | Path, lock_timeout: float = LOCK_TIMEOUT
) -> Plan:
    from dstack_plan.project import Project

    opened = Project(Path(project), configs=resources, submit=True)
    try:
        async with opened.locked("apply", lock_timeout):
            plan, _ = await opened.plan()
            if plan.has_changes:
                report = await opened.apply(plan)
                if not report.ok:
                    raise ApplyFailed(report)
    finally:
        await opened.close()
    return plan


def apply(
    configs: Sequence[Config], project: str | Path = ".", *, lock_timeout: float = LOCK_TIMEOUT
) -> Plan:
    return run_sync(aapply(configs, project, lock_timeout=lock_timeout))


async def asubmit_task(
    image: str | None = None,
    commands: list[str] | None = None,
    resources: Mapping[str, Any] | None = None,
    name: str | None = None,
    env: Mapping[str, str] | list[str] | None = None,
    fleets: list[str] | None = None,
    project: str | Path = ".",
    **fields: Any,
) -> Run:
    """`submit_task` for async code."""
    built = Task(
        name=name,
        image=image,
        commands=commands,
        resources=dict(resources) if resources is not None else None,
        env=dict(env) if isinstance(env, Mapping) else env,
        fleets=fleets,
        **fields,
    ).resource()
    await _apply_resources([built], project)
    return Run(Path(project), built.address)  # its name derived, when none was given


def submit_task(
    image: str | None = None,
    commands: list[str] | None = None,
    resources: Mapping[str, Any] | None = None,
    name: str | None = None,
    env: Mapping[str, str] | list[str] | None = None,
    fleets: list[str] | None = None,
    project: str | Path = ".",
    **fields: Any,
) -> Run:
    """Run a task (`commands` in `image`, or on the host without one) with `resources` as a
    YAML task's (`{"gpu": 4, "memory": "64GB"}`) in the project at `project`, and return its
    handle. Other task fields (`nodes`, `retry`, `max_duration`, ...) go in `fields`.
    SpecError names each invalid field's path."""
    return run_sync(asubmit_task(image, commands, resources, name, env, fleets, project, **fields))
