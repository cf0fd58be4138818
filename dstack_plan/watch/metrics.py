"""`dstack watch`'s Prometheus metrics: what each tick saw, in prometheus_client's registry.

Gauges describe the last tick only and are rebuilt from it as one snapshot, so a series whose
subject is gone (a host removed or unreachable, a fleet deleted) disappears at once instead of
repeating a stale value, and a scrape never sees a half-updated tick. The retry counter and
the reconcile-duration histogram accumulate over the process's life, as Prometheus expects.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from dstack_plan.errors import DstackPlanError
from dstack_plan.fleets.host_status import INSTANCE_STATUSES as HOST_INSTANCE_STATUSES
from dstack_plan.watch.model import HostSeen, TickReport

log = logging.getLogger(__name__)

RUN_STATUSES = (
    "pending",
    "submitted",
    "provisioning",
    "running",
    "terminating",
    "terminated",
    "failed",
    "done",
)
JOB_STATUSES = (
    "submitted",
    "provisioning",
    "pulling",
    "running",
    "terminating",
    "terminated",
    "aborted",
    "failed",
    "done",
)
INSTANCE_STATUSES = HOST_INSTANCE_STATUSES
"""dstack's instance statuses, always exported (as 0 when none), so a dashboard shows 0 rather
than "no data"; `unreachable` is exported when it occurs. Each host's status comes from
`fleets.host_status.host_status` (`busy` while any job runs there, of any project)."""

RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds; the target is a tick under 1 s, and a tick stuck on agents lasts tens of seconds."""

_AGENT_GPU_UTIL = "dstack_agent_gpu_utilization_percent"
_AGENT_GPU_MEM = "dstack_agent_gpu_memory_used_bytes"
_AGENT_NET = "dstack_agent_network_bytes_total"
_WANTED = (_AGENT_GPU_UTIL, _AGENT_GPU_MEM, _AGENT_NET)
_WANTED_COMMENTS = tuple(f"# {kind} {name}" for kind in ("HELP", "TYPE") for name in _WANTED)


@dataclass
class HostReading:
    """What one agent's exposition says, reduced to what watch exports."""

    gpu_utilization: dict[str, float] = field(default_factory=dict)
    gpu_memory_used: dict[str, float] = field(default_factory=dict)
    network: dict[str, float] = field(default_factory=dict)
    """direction -> cumulative bytes."""


def read_host(host: HostSeen) -> HostReading | None:
    """The agent's metrics text parsed; None when it is missing or malformed (logged: one bad
    agent must not take the metrics of every other host with it)."""
    if not host.reachable or host.metrics_text is None:
        return None
    reading = HostReading()
    # Only the families watch uses are parsed: the rest (CPU, memory, ...) is most of the text,
    # and with 50 agents a tick would spend most of its metrics time on it.
    wanted = "\n".join(
        line
        for line in host.metrics_text.splitlines()
        if line.startswith(_WANTED) or line.startswith(_WANTED_COMMENTS)
    )
    try:
        for family in text_string_to_metric_families(wanted):
            for sample in family.samples:
                if sample.name == _AGENT_GPU_UTIL and "gpu" in sample.labels:
                    reading.gpu_utilization[sample.labels["gpu"]] = sample.value
                elif sample.name == _AGENT_GPU_MEM and "gpu" in sample.labels:
                    reading.gpu_memory_used[sample.labels["gpu"]] = sample.value
                elif sample.name == _AGENT_NET and "direction" in sample.labels:
                    reading.network[sample.labels["direction"]] = sample.value
    except ValueError as e:
        log.warning("unreadable metrics from %s: %s", host.host, e)
        return None
    return reading


@dataclass(frozen=True)
class _Snapshot:
    """The gauges of one tick, exported together."""

    leader: bool = False
    queue_depth: int = 0
    runs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RUN_STATUSES, 0))
    jobs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(JOB_STATUSES, 0))
    instances: dict[tuple[str, str], int] = field(default_factory=dict)
    gpu_utilization: dict[tuple[str, str], float] = field(default_factory=dict)
    gpu_memory_used: dict[tuple[str, str], float] = field(default_factory=dict)
    network: dict[tuple[str, str], float] = field(default_factory=dict)
    """(host, direction) -> bytes per second between the last two ticks that read it."""
    bandwidth: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(fleet, src, dst) -> bytes per second last measured by fleet apply or `dstack fleet
    probe` (from state)."""


class _SnapshotCollector(Collector):
    """Yields the current snapshot's gauges at every scrape."""

    def __init__(self) -> None:
        self.snapshot = _Snapshot()

    def collect(self) -> Iterable[Metric]:
        s = self.snapshot  # one read: the loop may swap in the next tick meanwhile
        yield _gauge(
            "dstack_watch_leader",
            "1 if this watch holds the leader lease, else 0",
            [((), 1.0 if s.leader else 0.0)],
        )
        yield _gauge(
            "dstack_task_queue_depth",
            "Runs waiting to be placed (pending)",
            [((), float(s.queue_depth))],
        )
        yield _gauge(
            "dstack_runs",
            "Runs in state, by status",
            [((k,), float(v)) for k, v in s.runs.items()],
            ("status",),
        )
        yield _gauge(
            "dstack_jobs",
            "Jobs of runs in state, by the status their agent reports",
            [((k,), float(v)) for k, v in s.jobs.items()],
            ("status",),
        )
        yield _gauge(
            "dstack_instances",
            "Machines of each fleet, by status",
            [(k, float(v)) for k, v in s.instances.items()],
            ("fleet", "status"),
        )
        yield _gauge(
            "dstack_gpu_utilization",
            "GPU utilisation in percent (0-100), as the host's agent reports it",
            s.gpu_utilization.items(),
            ("host", "gpu"),
        )
        yield _gauge(
            "dstack_gpu_memory_used_bytes",
            "GPU memory in use",
            s.gpu_memory_used.items(),
            ("host", "gpu"),
        )
        yield _gauge(
            "dstack_network_throughput_bytes",
            "Bytes per second through the host's interfaces between the last two ticks",
            s.network.items(),
            ("host", "direction"),
        )
        yield _gauge(
            "dstack_host_bandwidth_bytes_per_second",
            "TCP throughput from src to dst, last measured by fleet apply or `fleet probe`",
            s.bandwidth.items(),
            ("fleet", "src", "dst"),
        )


def _gauge(
    name: str,
    help_text: str,
    samples: Iterable[tuple[tuple[str, ...], float]],
    labels: tuple[str, ...] = (),
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=list(labels))
    for values, value in sorted(samples):
        family.add_metric(list(values), value)
    return family


class MetricsServer:
    """prometheus_client's HTTP exporter, running in a daemon thread until `close()`."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def host(self) -> str:
        """The address it listens on."""
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen when asked for port 0)."""
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop answering and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WatchMetrics:
    """The metrics of one watch process, in a registry of its own (not prometheus_client's
    global one, so several watchers, or tests, never share series)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._snapshot = _SnapshotCollector()
        self.registry.register(self._snapshot)
        self._retries = Counter(
            "dstack_retries",
            "Jobs or runs resubmitted by watch",
            registry=self.registry,
        )
        self._duration = Histogram(
            "dstack_reconcile_duration_seconds",
            "Duration of one reconcile tick",
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self._network_counters: dict[str, tuple[float, dict[str, float]]] = {}
        """host -> (tick start, direction -> bytes) of the last tick that read its counters."""
        self._lock = threading.Lock()

    def observe(self, report: TickReport) -> None:
        """Update every metric from one tick's report."""
        with self._lock:  # two observes at once would interleave the network counters
            self._retries.inc(max(0, report.retries))
            self._duration.observe(max(0.0, report.duration_s))
            self._snapshot.snapshot = self._build(report)

    def _build(self, report: TickReport) -> _Snapshot:
        runs = dict.fromkeys(RUN_STATUSES, 0)
        for status in report.runs.values():
            runs[status] = runs.get(status, 0) + 1
        jobs = dict.fromkeys(JOB_STATUSES, 0)
        for job in report.jobs:
            jobs[job.status] = jobs.get(job.status, 0) + 1
        instances: dict[tuple[str, str], int] = {}
        for fleet, counts in report.fleets.items():
            for status in INSTANCE_STATUSES:
                instances[(fleet, status)] = 0
            for status, count in counts.items():
                instances[(fleet, status)] = count
        utilization: dict[tuple[str, str], float] = {}
        memory_used: dict[tuple[str, str], float] = {}
        network: dict[tuple[str, str], float] = {}
        for host in report.hosts:
            reading = read_host(host)
            if reading is None:
                continue
            for gpu, value in reading.gpu_utilization.items():
                utilization[(host.host, gpu)] = value
            for gpu, value in reading.gpu_memory_used.items():
                memory_used[(host.host, gpu)] = value
            for direction, rate in self._rates(host.host, report.started_at, reading).items():
                network[(host.host, direction)] = rate
        # A host no longer in the report is gone: forget its counters. An unreachable one keeps
        # them, so its first answer after the outage gives the average rate over the gap.
        present = {h.host for h in report.hosts}
        for host_name in set(self._network_counters) - present:
            del self._network_counters[host_name]
        return _Snapshot(
            leader=report.leader,
            queue_depth=report.queue_depth,
            runs=runs,
            jobs=jobs,
            instances=instances,
            gpu_utilization=utilization,
            gpu_memory_used=memory_used,
            network=network,
            bandwidth={(f, src, dst): rate for f, src, dst, rate in report.bandwidth},
        )

    def _rates(self, host: str, now: float, reading: HostReading) -> dict[str, float]:
        """Bytes per second since this host's previous reading; none on its first reading, and
        none for a counter that went down (the host rebooted: the next tick has a rate again)."""
        previous = self._network_counters.get(host)
        if reading.network:
            self._network_counters[host] = (now, dict(reading.network))
        if previous is None:
            return {}
        then, counters = previous
        elapsed = now - then
        if elapsed <= 0:
            return {}
        rates = {}
        for direction, value in reading.network.items():
            before = counters.get(direction)
            if before is not None and value >= before:
                rates[direction] = (value - before) / elapsed
        return rates

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve `/metrics` on `host:port` (loopback by default: put a reverse proxy or an SSH
        tunnel in front to reach it from elsewhere); port 0 picks a free one."""
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise DstackPlanError(
                f"cannot serve metrics on {host}:{port}: {e.strerror or e}"
            ) from None
        return MetricsServer(server, thread)

    def write_file(self, path: str | Path) -> None:
        """Write the exposition to `path` atomically (a temporary file in the same directory,
        fsynced, then renamed over it), so a reader such as node_exporter's textfile collector
        never sees half a file."""
        target = Path(path)
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            with os.fdopen(fd, "wb") as f:
                f.write(self.render())
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a metrics reader is often another user
            os.replace(tmp, target)
        except OSError as e:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            message = f"cannot write metrics file {target}: {e.strerror or e}"
            raise DstackPlanError(message) from None
