"""Which of a running job's limits it has crossed (pure: time and samples come in).

- `max_duration` (only the running state counts, from the job's `started_at`): the agent stops
  the job itself (`max_duration_exceeded`), even while no watch runs; watch only reports it;
- `inactivity_duration` (dev environments): no connection for that long, from the last activity
  the caller saw (or the start, when it saw none): watch stops the job;
- `utilization_policy`: EVERY GPU of the job stayed under `min_gpu_utilization` percent for
  the whole `time_window`, from the samples the caller keeps (`GpuSample`): watch stops the
  job. dstack stops a job when any one GPU is idle; here (issue 14) a job that still uses some
  GPU is never stopped, and a job with no GPUs never is. "The whole window" means samples that
  cover it, and time since the job started: a job that started less than a window ago is
  never stopped.

Watch stops a job for a limit with the run's `stop_duration` as the graceful window
(`runs.handler.stop_seconds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.runs import DevEnvironmentSpec, RunSpec

MAX_DURATION_EXCEEDED = "max_duration_exceeded"
INACTIVITY_DURATION_EXCEEDED = "inactivity_duration_exceeded"
UTILIZATION_POLICY = "terminated_due_to_utilization_policy"


class GpuSample(NamedTuple):
    """One utilization reading of one GPU of a host."""

    at: float
    """Epoch seconds."""
    gpu: int
    """The GPU's index on its host."""
    util: float
    """Percent, 0..100."""


class Breach(BaseModel):
    """A limit a job has crossed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: Literal["max_duration", "inactivity_duration", "utilization_policy"]
    reason: str
    """The termination reason the job ends with (dstack's name)."""
    since: float
    """When the limit was crossed."""
    message: str
    enforced_by: Literal["agent", "watch"]
    """`agent`: the agent stops the job itself (report only); `watch`: watch stops it."""


def limit_breaches(
    spec: RunSpec,
    job: JobInfo,
    now: float,
    *,
    gpu_samples: Sequence[GpuSample] = (),
    last_activity_at: float | None = None,
) -> list[Breach]:
    """The limits of `spec` that `job` (not finished, started) has crossed by `now`.

    `gpu_samples`: readings of the job's host (other GPUs' are ignored), any order.
    `last_activity_at`: the last time a connection to a dev environment was seen.
    """
    if job.finished or job.started_at is None:
        return []
    started = job.started_at
    breaches = []
    if isinstance(spec.max_duration, int) and now - started > spec.max_duration:
        breaches.append(
            Breach(
                limit="max_duration",
                reason=MAX_DURATION_EXCEEDED,
                since=started + spec.max_duration,
                message=f"running for {now - started:g}s, over max_duration of "
                f"{spec.max_duration}s",
                enforced_by="agent",
            )
        )
    if isinstance(spec, DevEnvironmentSpec) and isinstance(spec.inactivity_duration, int):
        idle_since = max(started, last_activity_at or started)
        if now - idle_since > spec.inactivity_duration:
            breaches.append(
                Breach(
                    limit="inactivity_duration",
                    reason=INACTIVITY_DURATION_EXCEEDED,
                    since=idle_since + spec.inactivity_duration,
                    message=f"inactive for {now - idle_since:g}s, over inactivity_duration of "
                    f"{spec.inactivity_duration}s",
                    enforced_by="watch",
                )
            )
    policy = spec.utilization_policy
    gpus = sorted(set(job.gpus))
    if policy is not None and gpus:
        low = [low_since(gpu_samples, gpu, policy.min_gpu_utilization) for gpu in gpus]
        if all(since is not None for since in low):
            # the window counts from when the LAST of them went low, and not before the start
            since = max([started, *(s for s in low if s is not None)])
            if now - since >= policy.time_window:
                listed = ", ".join(map(str, gpus))
                what = f"GPU {listed}" if len(gpus) == 1 else f"all {len(gpus)} GPUs ({listed})"
                breaches.append(
                    Breach(
                        limit="utilization_policy",
                        reason=UTILIZATION_POLICY,
                        since=since + policy.time_window,
                        message=f"{what} utilization below {policy.min_gpu_utilization}% "
                        f"for {now - since:g}s (time_window {policy.time_window}s)",
                        enforced_by="watch",
                    )
                )
    return breaches


def low_since(samples: Iterable[GpuSample], gpu: int, threshold: float) -> float | None:
    """When the latest unbroken run of readings of `gpu` under `threshold` began (the earliest
    reading of it), or None when its latest reading is not under it or there is none."""
    readings = sorted((s for s in samples if s.gpu == gpu), key=lambda s: s.at)
    since = None
    for sample in readings:
        if sample.util < threshold:
            since = sample.at if since is None else since
        else:
            since = None
    return since


def trim_samples(samples: Iterable[GpuSample], now: float, window: float) -> list[GpuSample]:
    """The readings `low_since` still needs for a `window`: those of the last `window` seconds,
    and per GPU the newest one before them (it tells whether a low run began earlier)."""
    start = now - window
    kept: list[GpuSample] = []
    before: dict[int, GpuSample] = {}
    for sample in samples:
        if sample.at >= start:
            kept.append(sample)
        elif sample.gpu not in before or sample.at > before[sample.gpu].at:
            before[sample.gpu] = sample
    return sorted([*before.values(), *kept], key=lambda s: (s.at, s.gpu))
