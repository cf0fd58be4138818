"""The nodes of a multi-node task live and end together (pure).

A distributed job whose rank 1 died waits forever on a collective: if one node fails, the
others are stopped and the run fails as one. With `stop_criteria: master-done`, the run is
over when the master (node 0) ends: the workers are stopped then. Whoever watches the jobs
(`apply --attach`, `dstack attach`, and `dstack watch`) asks `gang_stops` each time a job ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from dstack_plan.agent.api_models import JobInfo, JobStatus
from dstack_plan.apply.run_records import JobRecord
from dstack_plan.config.runs import RunSpec, TaskSpec


def gang_stops(
    spec: RunSpec, ended: JobRecord, info: JobInfo, others: Sequence[JobRecord]
) -> tuple[list[JobRecord], str | None]:
    """The jobs among `others` (the run's jobs still running) to stop now that `ended`
    finished as `info` says, and why (None when nothing is to stop)."""
    if not isinstance(spec, TaskSpec) or spec.node_count() < 2 or not others:
        return [], None
    if info.status is JobStatus.FAILED or (info.exit_code not in (None, 0)):
        return list(others), f"node {ended.node} failed: the other nodes are stopped"
    if spec.stop_criteria == "master-done" and ended.node == 0:
        return list(others), "the master node is done (stop_criteria: master-done)"
    return [], None
