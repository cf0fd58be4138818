"""One reading of a host for `dstack top`, from its agent's metrics text and job list.

Pure functions: what the agent's `/metrics` (Prometheus text, see `agent/metrics.py`) and
`/jobs` answer goes in, numbers come out. CPU use is a rate, so it takes two readings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dstack_plan.agent.api_models import JobInfo

_CPU = "dstack_agent_cpu_seconds_total"
_IDLE_MODES = ("idle", "iowait")
"""CPU time in these modes is time the CPUs had nothing to run."""

Sample = tuple[dict[str, str], float]


def parse_metrics(text: str) -> dict[str, list[Sample]]:
    """Metric name -> its samples (labels, value), from Prometheus text format 0.0.4, read
    by prometheus_client's parser.

    Lines it cannot read (a malformed value) are skipped, each on its own: a newer agent may
    add metrics this controller does not know, and one bad line must not hide the rest."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, list[Sample]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            continue
        for family in families:
            for sample in family.samples:
                found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


@dataclass(frozen=True)
class HostReading:
    """What one host's agent said at one moment."""

    cpu_busy_s: float | None
    """CPU seconds spent working, all CPUs together, since boot (None: not reported)."""
    cpu_total_s: float | None
    memory_percent: float | None
    gpus_total: int
    gpus_used: int
    """GPUs the agent has allocated to a job."""
    runs: tuple[str, ...]
    """The run name of every job not finished, oldest first."""


def reading(metrics_text: str, jobs: Sequence[JobInfo]) -> HostReading:
    """A host's reading from its agent's metrics text and job list."""
    metrics = parse_metrics(metrics_text)
    cpu = {labels.get("mode", ""): value for labels, value in metrics.get(_CPU, [])}
    busy = total = None
    if cpu:
        total = sum(cpu.values())
        busy = total - sum(cpu.get(mode, 0.0) for mode in _IDLE_MODES)
    memory = None
    mem_total = _single(metrics, "dstack_agent_memory_total_bytes")
    mem_free = _single(metrics, "dstack_agent_memory_available_bytes")
    if mem_total and mem_free is not None:
        memory = round(100.0 * (mem_total - mem_free) / mem_total, 1)
    allocated = metrics.get("dstack_agent_gpu_allocated", [])
    return HostReading(
        cpu_busy_s=busy,
        cpu_total_s=total,
        memory_percent=memory,
        gpus_total=len(allocated),
        gpus_used=sum(1 for _, value in allocated if value > 0),
        runs=tuple(job.run_name for job in jobs if not job.finished),
    )


def _single(metrics: dict[str, list[Sample]], name: str) -> float | None:
    samples = metrics.get(name)
    return samples[0][1] if samples else None


def cpu_percent(before: HostReading, after: HostReading) -> float | None:
    """The share of the host's CPU time spent working between two readings, 0-100 (None
    when either lacks CPU counters or no CPU time passed)."""
    busy_0, total_0 = before.cpu_busy_s, before.cpu_total_s
    busy_1, total_1 = after.cpu_busy_s, after.cpu_total_s
    if busy_0 is None or total_0 is None or busy_1 is None or total_1 is None:
        return None
    elapsed = total_1 - total_0
    if elapsed <= 0:
        return None
    return round(min(100.0, max(0.0, 100.0 * (busy_1 - busy_0) / elapsed)), 1)
