"""A fleet host's status, as dstack's InstanceStatus names it: the one mapping `dstack fleet
list` (and `/api/fleets`), watch's `dstack_instances` metric and `dstack offer` share.

    host_status(recorded="idle", jobs=2)      # "busy"
    host_status(recorded="idle", jobs=None)   # "unreachable": its agent did not answer

The statuses are dstack's: `pending`, `provisioning` (being set up), `idle` (its agent answers
and no job runs on it), `busy` (at least one job that has not finished runs on it, of this
project or of any other sharing the host), `terminating`, `terminated`; and, for a host
whose agent does not answer, `unreachable` (dstack keeps that as a flag beside the status;
this project has always shown it as the status, as `offer` and the fleet records do).

A fleet's record (`fleets/records.py`) keeps only whether a host was set up and answered its
last check (`idle` there means no more than that); whether it is busy is asked of its agent
when it is shown, so the record is not rewritten each time a job starts or ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.protocol import FINISHED_STATUSES

HostStatus = Literal[
    "pending", "provisioning", "idle", "busy", "terminating", "terminated", "unreachable"
]
INSTANCE_STATUSES: Final = ("pending", "provisioning", "idle", "busy", "terminating", "terminated")
"""dstack's InstanceStatus values, in its order."""
IDLE: Final = "idle"
BUSY: Final = "busy"
UNREACHABLE: Final = "unreachable"
"""A host whose agent did not answer (the fleet records it so after a failed check; `dstack
watch` only from the third failed check in a row, `watch/reachability.py`)."""
LIFECYCLE: Final = frozenset({"pending", "provisioning", "terminating", "terminated"})
"""Recorded statuses that say the host is not (or no longer) there to run jobs: they stand
whatever its agent says."""


def host_status(recorded: str, jobs: int | None) -> HostStatus:
    """The status of a host from what is known about it.

    `recorded`: its status in its fleet's record (a lifecycle status there stands).
    `jobs`: how many jobs that have not finished its agent reports on it now, of every
    project (`unfinished_jobs`, `jobs_in_metrics`); None when its agent did not answer, or
    was not asked because its last check failed.
    """
    if recorded in LIFECYCLE:
        return recorded  # type: ignore[return-value]  # one of the Literal's, by LIFECYCLE
    if jobs is None:
        return UNREACHABLE
    return BUSY if jobs > 0 else IDLE


def unfinished_jobs(infos: Iterable[JobInfo]) -> int:
    """How many of an agent's listed jobs have not finished (`jobs` of `host_status`)."""
    return sum(1 for info in infos if not info.finished)


_AGENT_JOBS = "dstack_agent_jobs"


def jobs_in_metrics(text: str) -> int | None:
    """`jobs` of `host_status` from an agent's Prometheus text (`dstack_agent_jobs`, by
    status: every job the agent knows, of every project); None when the text has none."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = "\n".join(
        line
        for line in text.splitlines()
        if line.startswith((_AGENT_JOBS, f"# TYPE {_AGENT_JOBS} "))
    )
    count, seen = 0, False
    try:
        for family in text_string_to_metric_families(wanted + "\n"):
            for sample in family.samples:
                if sample.name != _AGENT_JOBS:
                    continue
                seen = True
                if sample.labels.get("status") not in FINISHED_STATUSES:
                    count += int(sample.value)
    except ValueError:
        return None
    return count if seen else None
