"""Metrics history: a ring of the last samples of `dstack watch`, bounded by count and age.

Fed by a watch reporter (`observe`, one sample a tick); memory stays bounded however long
watch runs: at most `max_samples` samples, none older than `max_age` seconds by the clock
given (the watch's, so tests drive hours of ticks with a `FakeClock`). Each sample keeps
per-host figures only (not per GPU), so a sample of 50 hosts is a few kilobytes.
"""

from __future__ import annotations

from collections import Counter, deque
from threading import Lock

from dstack_plan.clock import Clock
from dstack_plan.watch.metrics import read_host
from dstack_plan.watch.model import TickReport
from dstack_plan.web.models import MetricsHistory, MetricsSample

MAX_AGE = 6 * 3600.0
"""Seconds of history kept: the last six hours."""
MAX_SAMPLES = 4320
"""Six hours at watch's default 5-second interval."""


def sample_of(report: TickReport) -> MetricsSample:
    """The sample of one tick's report."""
    utilization: dict[str, float] = {}
    memory: dict[str, float] = {}
    for host in report.hosts:
        reading = read_host(host)
        if reading is None:
            continue
        if reading.gpu_utilization:
            values = reading.gpu_utilization.values()
            utilization[host.host] = round(sum(values) / len(values), 2)
        if reading.gpu_memory_used:
            memory[host.host] = sum(reading.gpu_memory_used.values())
    return MetricsSample(
        time=report.started_at,
        duration_s=report.duration_s,
        leader=report.leader,
        queue_depth=report.queue_depth,
        retries=report.retries,
        runs=dict(Counter(report.runs.values())),
        jobs=dict(Counter(job.status for job in report.jobs)),
        gpu_utilization=utilization,
        gpu_memory_used_bytes=memory,
        hosts_unreachable=sum(1 for h in report.hosts if not h.reachable),
    )


class History:
    """The ring. `observe` may be called from the watch loop while requests read it."""

    def __init__(
        self, clock: Clock, *, max_samples: int = MAX_SAMPLES, max_age: float = MAX_AGE
    ) -> None:
        if max_samples < 1 or max_age <= 0:
            raise ValueError("max_samples must be at least 1 and max_age more than 0")
        self.clock = clock
        self.max_samples = max_samples
        self.max_age = max_age
        self._samples: deque[MetricsSample] = deque(maxlen=max_samples)
        self._lock = Lock()

    def __len__(self) -> int:
        return len(self._samples)

    def observe(self, report: TickReport, changes: object = None) -> None:
        """Add the sample of `report` (a watch `Reporter`: `changes` is not used)."""
        sample = sample_of(report)
        with self._lock:
            self._samples.append(sample)
            self._expire()

    def _expire(self) -> None:
        oldest = self.clock.now() - self.max_age
        while self._samples and self._samples[0].time < oldest:
            self._samples.popleft()

    def view(self, since: float | None = None) -> MetricsHistory:
        """The samples kept (from `since`, epoch seconds, when given), oldest first."""
        with self._lock:
            self._expire()
            kept = tuple(s for s in self._samples if since is None or s.time >= since)
        return MetricsHistory(
            recording=True, max_samples=self.max_samples, max_age_s=self.max_age, samples=kept
        )
