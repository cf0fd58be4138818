"""Runs whose deletion also removes what `dstack attach` wrote for them: a dev environment's
`Host <run>` SSH entry (`inspect/dev_ssh.py`). Every deletion of a run goes through its
handler's `delete` (destroy, an apply that removes or replaces it, a deposed object), so the
entry never outlives the job it reaches."""

from __future__ import annotations

from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.apply.runs import RunHandler
from dstack_plan.state.model import ResourceState


class DevSSHRunHandler(RunHandler):
    """`RunHandler`, and a deleted dev environment's SSH entry goes with its jobs."""

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        await super().delete(current, ctx)
        if current.kind == "dev-environment":
            from dstack_plan.inspect.dev_ssh import forget

            forget(current)
