"""`WatchMetrics`: TickReports in, Prometheus exposition out, read back with prometheus_client's
own parser; agents' metrics text made by the agent's own functions."""

from __future__ import annotations

import os
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from dstack_plan.agent.metrics import Family, host_families, render
from dstack_plan.errors import DstackPlanError
from dstack_plan.watch.metrics import RECONCILE_BUCKETS, WatchMetrics
from dstack_plan.watch.model import HostSeen, JobSeen, TickReport

T0 = 1_700_000_000.0
MIB = 1024 * 1024


def agent_text(gpus: list[tuple[int, float, int]], rx: int | None = None, tx: int = 0) -> str:
    """An agent's /metrics: GPUs as (index, utilisation %, MiB used); network counters given
    (the agent's own would be this machine's real, moving ones)."""
    usage = [
        {"index": i, "utilization_percent": util, "memory_used_mib": mib, "memory_total_mib": 80}
        for i, util, mib in gpus
    ]
    families = [
        f
        for f in host_families(1.0, {"running": 1}, usage, {}, [i for i, _, _ in gpus])
        if f.name != "dstack_agent_network_bytes_total"
    ]
    if rx is not None:
        net = Family("dstack_agent_network_bytes_total", "counter", "Bytes")
        families.append(net.add(rx, direction="rx").add(tx, direction="tx"))
    return render(families)


def host(name: str, text: str | None, fleet: str = "onprem", reachable: bool = True) -> HostSeen:
    return HostSeen(fleet=fleet, host=name, reachable=reachable, metrics_text=text)


def report(at: float = T0, **fields: Any) -> TickReport:
    fields.setdefault("duration_s", 0.2)
    fields.setdefault("leader", True)
    return TickReport(started_at=at, **fields)


def scrape(metrics: WatchMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the exposition: (name, labels) -> value."""
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def series(metrics: WatchMetrics, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in scrape(metrics).items() if n == name}


def L(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def test_gpu_utilisation_and_memory_come_per_host_and_gpu_from_each_agents_exposition() -> None:
    m = WatchMetrics()
    m.observe(
        report(
            hosts=(
                host("h1", agent_text([(0, 97.0, 1000), (1, 3.0, 0)])),
                host("h2", agent_text([(0, 50.0, 2048)])),
            )
        )
    )
    assert series(m, "dstack_gpu_utilization") == {
        L(host="h1", gpu="0"): 97.0,
        L(host="h1", gpu="1"): 3.0,
        L(host="h2", gpu="0"): 50.0,
    }
    assert series(m, "dstack_gpu_memory_used_bytes") == {
        L(host="h1", gpu="0"): 1000 * MIB,
        L(host="h1", gpu="1"): 0.0,
        L(host="h2", gpu="0"): 2048 * MIB,
    }


def test_runs_jobs_and_instances_are_counted_by_status_with_zeros_for_known_statuses() -> None:
    m = WatchMetrics()
    m.observe(
        report(
            runs={"task.a": "running", "task.b": "running", "service.c": "pending"},
            jobs=(
                JobSeen(address="task.a", job_id="a-0-0-0", host="h1", status="running"),
                JobSeen(address="task.b", job_id="b-0-0-0", host="h2", status="unknown"),
            ),
            fleets={"onprem": {"busy": 2, "unreachable": 1}, "cloud": {"idle": 1}},
            queue_depth=1,
        )
    )
    runs = series(m, "dstack_runs")
    assert runs[L(status="running")] == 2 and runs[L(status="pending")] == 1
    assert runs[L(status="failed")] == 0  # known, none now: 0, not a missing series
    jobs = series(m, "dstack_jobs")
    assert jobs[L(status="running")] == 1 and jobs[L(status="unknown")] == 1
    assert jobs[L(status="pulling")] == 0
    instances = series(m, "dstack_instances")
    assert instances[L(fleet="onprem", status="busy")] == 2
    assert instances[L(fleet="onprem", status="unreachable")] == 1
    assert instances[L(fleet="cloud", status="idle")] == 1
    assert instances[L(fleet="cloud", status="busy")] == 0
    assert series(m, "dstack_task_queue_depth") == {L(): 1.0}


def test_leader_is_1_while_holding_the_lease_and_0_as_a_standby() -> None:
    m = WatchMetrics()
    m.observe(report(leader=True))
    assert series(m, "dstack_watch_leader") == {L(): 1.0}
    m.observe(report(leader=False))
    assert series(m, "dstack_watch_leader") == {L(): 0.0}


def test_retries_accumulate_across_ticks_and_tick_durations_fill_the_histogram() -> None:
    m = WatchMetrics()
    m.observe(report(retries=2, duration_s=0.3))
    m.observe(report(retries=0, duration_s=0.02))
    m.observe(report(retries=1, duration_s=4.0))
    assert series(m, "dstack_retries_total") == {L(): 3.0}
    assert series(m, "dstack_reconcile_duration_seconds_count") == {L(): 3.0}
    assert series(m, "dstack_reconcile_duration_seconds_sum")[L()] == pytest.approx(4.32)
    buckets = series(m, "dstack_reconcile_duration_seconds_bucket")
    assert buckets[L(le="0.025")] == 1 and buckets[L(le="0.5")] == 2
    assert buckets[L(le="5.0")] == 3 and buckets[L(le="+Inf")] == 3
    assert len(buckets) == len(RECONCILE_BUCKETS) + 1


def test_network_throughput_is_the_rate_between_two_ticks_counters() -> None:
    m = WatchMetrics()
    m.observe(report(T0, hosts=(host("h1", agent_text([], rx=1_000, tx=500)),)))
    assert series(m, "dstack_network_throughput_bytes") == {}  # one reading: no rate yet
    m.observe(report(T0 + 5, hosts=(host("h1", agent_text([], rx=11_000, tx=1_500)),)))
    assert series(m, "dstack_network_throughput_bytes") == {
        L(host="h1", direction="rx"): 2_000.0,
        L(host="h1", direction="tx"): 200.0,
    }
    # The host rebooted: counters went down. No made-up rate; the next tick has one again.
    m.observe(report(T0 + 10, hosts=(host("h1", agent_text([], rx=100, tx=0)),)))
    assert series(m, "dstack_network_throughput_bytes") == {}
    m.observe(report(T0 + 20, hosts=(host("h1", agent_text([], rx=1_100, tx=0)),)))
    assert series(m, "dstack_network_throughput_bytes")[L(host="h1", direction="rx")] == 100.0


@pytest.mark.skipif(not Path("/proc/net/dev").exists(), reason="needs /proc/net/dev")
def test_the_agents_own_exposition_of_this_machine_gives_rx_and_tx_throughput() -> None:
    m = WatchMetrics()
    for i in range(2):
        text = render(host_families(1.0, {}, [], {}, []))  # this machine's real counters
        m.observe(report(T0 + i, hosts=(host("here", text),)))
    rates = series(m, "dstack_network_throughput_bytes")
    assert set(rates) == {L(host="here", direction="rx"), L(host="here", direction="tx")}
    assert all(rate >= 0 for rate in rates.values())


def test_an_unreachable_host_resumes_with_the_average_rate_over_its_outage() -> None:
    m = WatchMetrics()
    m.observe(report(T0, hosts=(host("h1", agent_text([(0, 90.0, 10)], rx=0)),)))
    m.observe(report(T0 + 5, hosts=(host("h1", None, reachable=False),)))
    assert series(m, "dstack_gpu_utilization") == {}  # no stale value while it is away
    m.observe(report(T0 + 10, hosts=(host("h1", agent_text([(0, 90.0, 10)], rx=5_000)),)))
    assert series(m, "dstack_network_throughput_bytes")[L(host="h1", direction="rx")] == 500.0


def test_series_of_a_removed_host_or_fleet_vanish() -> None:
    m = WatchMetrics()
    both = (
        host("h1", agent_text([(0, 10.0, 1)], rx=0)),
        host("h2", agent_text([(0, 20.0, 2)], rx=0), fleet="other"),
    )
    m.observe(report(T0, hosts=both, fleets={"onprem": {"idle": 1}, "other": {"busy": 1}}))
    m.observe(report(T0 + 1, hosts=both, fleets={"onprem": {"idle": 1}, "other": {"busy": 1}}))
    assert {dict(k)["host"] for k in series(m, "dstack_network_throughput_bytes")} == {"h1", "h2"}

    m.observe(report(T0 + 2, hosts=both[:1], fleets={"onprem": {"idle": 1}}))
    for name in (
        "dstack_gpu_utilization",
        "dstack_gpu_memory_used_bytes",
        "dstack_network_throughput_bytes",
    ):
        assert {dict(k)["host"] for k in series(m, name)} == {"h1"}, name
    assert {dict(k)["fleet"] for k in series(m, "dstack_instances")} == {"onprem"}

    # h2 comes back: its old counters were forgotten, so no rate spans the time it was gone.
    m.observe(report(T0 + 100, hosts=both, fleets={"onprem": {"idle": 1}}))
    assert {dict(k)["host"] for k in series(m, "dstack_network_throughput_bytes")} == {"h1"}


def test_one_agents_unreadable_metrics_leave_the_other_hosts_metrics_intact() -> None:
    m = WatchMetrics()
    m.observe(
        report(
            hosts=(
                host("bad", "dstack_agent_gpu_utilization_percent{gpu=0 oops\n"),
                host("good", agent_text([(0, 42.0, 1)])),
            )
        )
    )
    assert series(m, "dstack_gpu_utilization") == {L(host="good", gpu="0"): 42.0}


def test_each_watch_has_its_own_registry_and_leaves_the_global_one_alone() -> None:
    a, b = WatchMetrics(), WatchMetrics()
    a.observe(report(retries=5))
    assert series(b, "dstack_retries_total") == {L(): 0.0}
    assert REGISTRY.get_sample_value("dstack_retries_total") is None


def test_the_http_endpoint_answers_on_loopback_and_stops_listening_when_closed() -> None:
    m = WatchMetrics()
    m.observe(report(queue_depth=7))
    with m.serve(0) as server:
        assert server.host == "127.0.0.1"
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode()
        m.observe(report(queue_depth=3))  # a later tick is what the next scrape sees
        with urllib.request.urlopen(url, timeout=5) as response:
            later = response.read().decode()
        port = server.port
    assert "dstack_task_queue_depth 7.0" in body
    assert "dstack_task_queue_depth 3.0" in later
    with pytest.raises(ConnectionRefusedError):  # closed: nothing listens there any more
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_serving_on_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DstackPlanError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            WatchMetrics().serve(port)


def test_write_file_replaces_the_file_whole_and_leaves_no_temporary_behind(
    tmp_path: Path,
) -> None:
    target = tmp_path / "watch.prom"
    target.write_text("old contents\n")
    m = WatchMetrics()
    m.observe(report(queue_depth=4))
    m.write_file(target)
    assert target.read_bytes() == m.render()
    assert os.listdir(tmp_path) == ["watch.prom"]
    assert target.stat().st_mode & 0o777 == 0o644
    families = {f.name for f in text_string_to_metric_families(target.read_text())}
    assert "dstack_task_queue_depth" in families


def test_write_file_into_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DstackPlanError, match="cannot write metrics file"):
        WatchMetrics().write_file(tmp_path / "nope" / "watch.prom")
