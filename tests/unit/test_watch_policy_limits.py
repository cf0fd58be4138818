"""Watch's limit checks (watch/limits.py): max_duration, inactivity, GPU utilization."""

from __future__ import annotations

from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.runs import DevEnvironmentSpec, RunSpec, TaskSpec
from dstack_plan.watch.limits import GpuSample, limit_breaches, low_since, trim_samples

T = 1_800_000_000.0


def task(**fields: Any) -> TaskSpec:
    return TaskSpec.model_validate({"type": "task", "name": "train", "commands": ["x"], **fields})


def dev(**fields: Any) -> DevEnvironmentSpec:
    return DevEnvironmentSpec.model_validate({"type": "dev-environment", "name": "dev", **fields})


def info(
    status: str = "running", started_at: float | None = T, gpus: tuple[int, ...] = ()
) -> JobInfo:
    return JobInfo.model_validate(
        {
            "id": "j1",
            "run_name": "train",
            "runtime": "docker",
            "status": status,
            "submitted_at": T - 10,
            "started_at": started_at,
            "gpus": list(gpus),
        }
    )


def limits(spec: RunSpec, job: JobInfo, now: float, **kw: Any) -> list[tuple[str, str, float]]:
    return [(b.limit, b.enforced_by, b.since) for b in limit_breaches(spec, job, now, **kw)]


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (T + 3600, []),
        (T + 3600.5, [("max_duration", "agent", T + 3600)]),
    ],
)
def test_max_duration_is_reported_only(now: float, expected: list[Any]) -> None:
    assert limits(task(max_duration="1h"), info(), now) == expected


@pytest.mark.parametrize(
    ("spec", "job"),
    [
        (task(max_duration="off"), info()),
        (task(), info()),
        (task(max_duration="1h"), info(status="done")),  # finished: nothing to say
        (task(max_duration="1h"), info(status="pulling", started_at=None)),  # not running yet
    ],
)
def test_no_max_duration_breach(spec: RunSpec, job: JobInfo) -> None:
    assert limit_breaches(spec, job, T + 86400) == []


@pytest.mark.parametrize(
    ("last_activity", "now", "breached_at"),
    [
        (T + 100, T + 700, None),  # exactly the duration: not over it
        (T + 100, T + 700.5, T + 700),
        (None, T + 600.5, T + 600),  # never seen a connection: counts from the start
        (T - 50, T + 600.5, T + 600),  # activity before the start does not count
    ],
)
def test_inactivity_of_a_dev_environment(
    last_activity: float | None, now: float, breached_at: float | None
) -> None:
    found = limits(dev(inactivity_duration="10m"), info(), now, last_activity_at=last_activity)
    expected = [] if breached_at is None else [("inactivity_duration", "watch", breached_at)]
    assert found == expected


def test_inactivity_off_never_breaches() -> None:
    assert limit_breaches(dev(inactivity_duration="off"), info(), T + 10**6) == []


POLICY = {"min_gpu_utilization": 10, "time_window": "5m"}


def samples(gpu: int, utils: list[float], start: float = T, every: float = 30) -> list[GpuSample]:
    return [GpuSample(start + i * every, gpu, u) for i, u in enumerate(utils)]


@pytest.mark.parametrize(
    ("now", "breached"),
    [(T + 299, False), (T + 300, True)],  # just short / just long enough
)
def test_utilization_window(now: float, breached: bool) -> None:
    readings = samples(0, [5.0] * 11)  # T .. T+300, all under 10%
    found = limits(task(utilization_policy=POLICY), info(gpus=(0,)), now, gpu_samples=readings)
    assert found == ([("utilization_policy", "watch", T + 300)] if breached else [])


def test_a_busy_reading_restarts_the_window() -> None:
    readings = samples(0, [5, 5, 5, 5, 50, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5])  # busy at T+120
    spec = task(utilization_policy=POLICY)
    assert low_since(readings, 0, 10) == T + 150
    assert limits(spec, info(gpus=(0,)), T + 449, gpu_samples=readings) == []
    assert limits(spec, info(gpus=(0,)), T + 450, gpu_samples=readings) != []


def test_one_busy_gpu_of_the_job_keeps_it() -> None:
    # unlike dstack (any idle GPU): a job still using some GPU is never stopped (issue 14)
    readings = samples(0, [2.0] * 12) + samples(1, [95.0] * 12)
    spec = task(utilization_policy=POLICY)
    assert limit_breaches(spec, info(gpus=(0, 1)), T + 3600, gpu_samples=readings) == []


def test_every_gpu_idle_stops_it_from_when_the_last_went_low() -> None:
    readings = samples(0, [2.0] * 20) + samples(1, [95.0] * 4 + [1.0] * 16)  # GPU 1 at T+120
    spec = task(utilization_policy=POLICY)
    assert limit_breaches(spec, info(gpus=(0, 1)), T + 419, gpu_samples=readings) == []
    found = limit_breaches(spec, info(gpus=(0, 1)), T + 420, gpu_samples=readings)
    assert [(b.limit, b.since) for b in found] == [("utilization_policy", T + 420)]
    assert "all 2 GPUs (0, 1)" in found[0].message


def test_the_window_counts_from_the_start_of_the_job() -> None:
    readings = samples(0, [0.0] * 40, start=T - 600)  # idle long before this job started
    spec = task(utilization_policy=POLICY)
    assert limit_breaches(spec, info(gpus=(0,)), T + 299, gpu_samples=readings) == []
    assert limit_breaches(spec, info(gpus=(0,)), T + 300, gpu_samples=readings) != []


@pytest.mark.parametrize(
    ("gpus", "readings"),
    [
        ((1,), samples(0, [0.0] * 20)),  # the idle GPU is another job's
        ((), samples(0, [0.0] * 20)),  # a CPU job
        ((0,), samples(0, [10.0] * 20)),  # at the threshold is not under it
        ((0,), samples(0, [0.0] * 19 + [80.0])),  # busy now
        ((0,), []),  # no readings yet
    ],
)
def test_no_utilization_breach(gpus: tuple[int, ...], readings: list[GpuSample]) -> None:
    job = info(gpus=gpus)
    assert (
        limit_breaches(task(utilization_policy=POLICY), job, T + 3600, gpu_samples=readings) == []
    )


def test_trimmed_samples_decide_the_same() -> None:
    spec = task(utilization_policy=POLICY)
    readings = samples(0, [50.0] * 5 + [1.0] * 60) + samples(1, [1.0] * 65)
    now = T + 64 * 30
    kept = trim_samples(readings, now, 300)
    assert len(kept) < len(readings)
    for gpus in ((0,), (1,)):
        full = limit_breaches(spec, info(gpus=gpus), now, gpu_samples=readings)
        trimmed = limit_breaches(spec, info(gpus=gpus), now, gpu_samples=kept)
        assert bool(full) == bool(trimmed) is True
    # a busy reading just before the window still counts after trimming
    busy_edge = (
        samples(0, [1.0] * 10) + [GpuSample(T + 290, 0, 90.0)] + samples(0, [1.0] * 11, T + 300)
    )
    kept = trim_samples(busy_edge, T + 600, 300)
    assert low_since(kept, 0, 10) == low_since(busy_edge, 0, 10) == T + 300
