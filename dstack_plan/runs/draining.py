"""What a plan says beforehand about hosts leaving an SSH fleet while jobs run there.

Apply refuses to remove such a host unless `apply --force` drains it (stops its jobs, each
within its `stop_duration`: `fleets/ssh.SSHFleetHandler.drain`). The plan says so first,
from the refreshed state alone (no host is asked), so that a reviewed plan never meets a
refusal it did not mention.
"""

from __future__ import annotations

from collections.abc import Iterator

from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.fleets.records import fleet_ssh_config
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.plan.model import Action, Plan, ResourceChange
from dstack_plan.runs.records import RunRecord
from dstack_plan.state.model import State


def drain_warnings(plan: Plan, state: State) -> tuple[str, ...]:
    """One warning per fleet update that removes hosts on which runs still have jobs
    (runs the same plan deletes or replaces are not counted: apply ends them itself)."""
    ending = {c.address for c in plan.changes if c.action is Action.DELETE or c.action.is_replace}
    warnings = []
    for change, removed in _removals(plan):
        busy: dict[str, set[str]] = {}
        for address, entry in state.resources.items():
            if entry.kind not in RUN_KINDS or address in ending:
                continue
            if entry.status in FINISHED_STATUSES:
                continue
            record = RunRecord.of(entry)
            if record.fleet != change.name:
                continue
            for job in record.jobs:
                if job.host in removed and job.status not in FINISHED_STATUSES:
                    busy.setdefault(job.host, set()).add(address)
        if busy:
            where = "; ".join(f"{host}: {', '.join(sorted(runs))}" for host, runs in busy.items())
            warnings.append(
                f"{change.address}: hosts leaving the fleet still run jobs ({where}): apply "
                "refuses to remove them; stop those runs first, or apply with --force to "
                "drain the hosts (their jobs are stopped)"
            )
    return tuple(warnings)


def _removals(plan: Plan) -> Iterator[tuple[ResourceChange, frozenset[str]]]:
    """Each SSH fleet update of `plan` with the names (`host_name`) of the hosts it removes."""
    for change in plan.changes:
        if change.kind != "fleet" or change.action is not Action.UPDATE:
            continue
        before, after = change.before or {}, change.after or {}
        if not before.get("ssh_config") or not after.get("ssh_config"):
            continue
        _, old = fleet_ssh_config(before, change.address)
        _, new = fleet_ssh_config(after, change.address)
        removed = frozenset(old.host_name(h) for h in old.hosts_leaving(new))
        if removed:
            yield change, removed
