"""What the limits actor remembers of the hosts' GPU readings (no agents): readings of the
hosts a run with a utilization_policy uses, stamped with the tick, gone after a missed one."""

from __future__ import annotations

from datetime import datetime, timezone

from dstack_plan.config.runs import TaskSpec
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.enforce import LimitEnforcer, _Watched
from dstack_plan.watch.limits import GpuSample
from dstack_plan.watch.model import HostSeen

T = 1_800_000_000.0
METRICS = (
    "# HELP dstack_agent_gpu_utilization_percent GPU utilisation\n"
    "# TYPE dstack_agent_gpu_utilization_percent gauge\n"
    'dstack_agent_gpu_utilization_percent{gpu="0"} 3\n'
    'dstack_agent_gpu_utilization_percent{gpu="1"} 70\n'
)


def watched(host: str = "h1") -> _Watched:
    spec = TaskSpec.model_validate(
        {
            "type": "task",
            "name": "train",
            "commands": ["x"],
            "utilization_policy": {"min_gpu_utilization": 10, "time_window": "5m"},
        }
    )
    job = JobRecord("j1", host=host, status="running")
    run = ResourceState.create(
        "task.train",
        provider="ssh",
        spec={},
        status="running",
        now=datetime(2027, 1, 1, tzinfo=timezone.utc),
        attributes=RunRecord(fleet="onprem", generation=1, jobs=(job,)).to_json(),
    )
    return _Watched(run, spec, "onprem", (job,))


def seen(host: str, reachable: bool = True) -> HostSeen:
    text = METRICS if reachable else None
    return HostSeen(fleet="onprem", host=host, reachable=reachable, metrics_text=text)


def test_readings_are_stamped_with_the_tick_and_trimmed_to_the_window() -> None:
    actor = LimitEnforcer()
    for i in range(12):  # every minute for 11 minutes: a 5m window keeps 5m and one before
        actor._sample([seen("h1"), seen("h2")], [watched()], T + 60 * i)
    kept = actor._samples[("onprem", "h1")]
    assert {s.at for s in kept} == {T + 60 * i for i in range(5, 12)}
    assert GpuSample(T + 660, 0, 3.0) in kept and GpuSample(T + 660, 1, 70.0) in kept
    assert ("onprem", "h2") not in actor._samples  # no run with a policy there


def test_a_tick_without_a_reading_starts_the_window_again() -> None:
    actor = LimitEnforcer()
    actor._sample([seen("h1")], [watched()], T)
    actor._sample([seen("h1", reachable=False)], [watched()], T + 60)
    assert ("onprem", "h1") not in actor._samples
    actor._sample([seen("h1")], [watched()], T + 120)
    assert {s.at for s in actor._samples[("onprem", "h1")]} == {T + 120}


def test_readings_are_forgotten_once_no_run_with_a_policy_uses_the_host() -> None:
    actor = LimitEnforcer()
    actor._sample([seen("h1")], [watched()], T)
    actor._sample([seen("h1")], [], T + 60)
    assert actor._samples == {}
