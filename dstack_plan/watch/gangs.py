"""Which jobs watch stops so that the nodes of a multi-node task end together (pure).

`apply.gang` says it for one job that just ended, as an attached apply sees it; watch sees the
recorded status of every job of a run each tick, and asks here.
"""

from __future__ import annotations

from collections.abc import Sequence

from dstack_plan.apply.run_records import JobRecord
from dstack_plan.config.runs import RunSpec, TaskSpec

FINISHED = frozenset({"done", "failed", "terminated", "aborted"})


def gang_leftovers(spec: RunSpec, jobs: Sequence[JobRecord]) -> tuple[list[JobRecord], str | None]:
    """The jobs of a multi-node task still running although the run is over, and why: a node
    failed, or (`stop_criteria: master-done`) the master is done."""
    if not isinstance(spec, TaskSpec) or spec.node_count() < 2:
        return [], None
    running = [j for j in jobs if j.status not in FINISHED]
    if not running:
        return [], None
    failed = [j for j in jobs if j.status == "failed"]
    if failed:
        return running, f"node {failed[0].node} failed: the other nodes are stopped"
    master_done = any(j.node == 0 and j.status == "done" for j in jobs)
    if spec.stop_criteria == "master-done" and master_done:
        return running, "the master node is done (stop_criteria: master-done)"
    return [], None
