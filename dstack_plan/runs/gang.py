"""The nodes of a multi-node task live and end together (pure).

A distributed job whose rank 1 died waits forever on a collective: if one node fails, the
others are stopped and the run fails as one. With `stop_criteria: master-done`, the run is
over when the master (node 0) ends: the workers are stopped then. Whoever watches the jobs
(`apply --attach`, `dstack attach`, and `dstack watch` each tick) asks `gang_leftovers`.
"""

from __future__ import annotations

from collections.abc import Sequence

from dstack_plan.config.runs import RunSpec, TaskSpec
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.runs.records import JobRecord


def gang_leftovers(spec: RunSpec, jobs: Sequence[JobRecord]) -> tuple[list[JobRecord], str | None]:
    """The jobs of a multi-node task still running although the run is over, and why: a node
    failed, or (`stop_criteria: master-done`) the master is done."""
    if not isinstance(spec, TaskSpec) or spec.node_count() < 2:
        return [], None
    running = [j for j in jobs if j.status not in FINISHED_STATUSES]
    if not running:
        return [], None
    failed = [j for j in jobs if j.status == "failed"]
    if failed:
        return running, f"node {failed[0].node} failed: the other nodes are stopped"
    master_done = any(j.node == 0 and j.status == "done" for j in jobs)
    if spec.stop_criteria == "master-done" and master_done:
        return running, "the master node is done (stop_criteria: master-done)"
    return [], None
