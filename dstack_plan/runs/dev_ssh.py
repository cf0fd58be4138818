"""Runs whose deletion also removes what `dstack attach` wrote for them: a dev environment's
`Host <run>` SSH entry (`runs/ssh_config.py`). Every deletion of a run goes through its
handler's `delete` (destroy, an apply that removes or replaces it, a deposed object), so the
entry never outlives the job it reaches; `dstack stop` removes it too (`forget`), and a run
created again over jobs that are gone (drift, where no delete ran) drops the older entry."""

from __future__ import annotations

import logging
from pathlib import Path

from dstack_plan.apply.handlers import ApplyContext, Outcome
from dstack_plan.errors import DstackPlanError
from dstack_plan.plan.model import ResourceChange
from dstack_plan.runs.handler import RunHandler
from dstack_plan.runs.records import RunRecord
from dstack_plan.runs.ssh_config import remove_entries
from dstack_plan.state.model import ResourceState

log = logging.getLogger(__name__)

DEV_KIND = "dev-environment"


class DevSSHRunHandler(RunHandler):
    """`RunHandler`, and a deleted dev environment's SSH entry goes with its jobs."""

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        outcome = await super().create(change, ctx)
        # an entry of this project's run of that name reaches an older object: one created
        # again over jobs that are gone (drift: its host left the fleet, or its agent lost
        # them) had no delete that removed it
        new = {str(j.get("id")) for j in outcome.attributes.get("jobs", [])}
        try:
            remove_entries(run=change.name, deployment=str(self.deployment), keep_jobs=new)
        except (OSError, DstackPlanError) as e:
            log.warning("%s: could not remove an older SSH entry: %s", change.address, e)
        return outcome

    async def delete(
        self, current: ResourceState, ctx: ApplyContext, *, keep_recorded: bool = False
    ) -> None:
        await super().delete(current, ctx, keep_recorded=keep_recorded)
        forget(current)  # a retry's ended attempt too: its jobs no longer run


def forget(run: ResourceState, directory: Path | None = None) -> list[str]:
    """Remove the SSH entries of `run`'s jobs (it was deleted or stopped); best effort: a
    config that cannot be rewritten is logged, never failing what removed the run."""
    if run.kind != DEV_KIND:
        return []
    jobs = {j.id for j in RunRecord.of(run).jobs}
    if not jobs:
        return []
    try:
        return remove_entries(directory, run=run.name, jobs=jobs)
    except (OSError, DstackPlanError) as e:
        log.warning("%s: could not remove its SSH entry: %s", run.address, e)
        return []
