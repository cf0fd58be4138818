"""The example Grafana dashboard queries only what `WatchMetrics` exposes, with labels those
metrics carry, and shows every metric watch exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dstack_plan.agent.metrics import Family, host_families, render
from dstack_plan.watch.metrics import WatchMetrics
from dstack_plan.watch.model import HostSeen, JobSeen, TickReport

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "monitoring" / "dstack-watch.json"
TARGET_LABELS = {"job", "instance"}  # added by Prometheus when it scrapes, on every series


def agent_text(rx: int) -> str:
    usage = [{"index": 0, "utilization_percent": 80, "memory_used_mib": 5, "memory_total_mib": 8}]
    families = [
        f
        for f in host_families(1.0, {}, usage, {}, [0])
        if f.name != "dstack_agent_network_bytes_total"
    ]
    net = Family("dstack_agent_network_bytes_total", "counter", "Bytes")
    return render([*families, net.add(rx, direction="rx").add(rx, direction="tx")])


def exposed() -> dict[str, set[str]]:
    """Sample name -> label names, scraped from a WatchMetrics that saw every kind of input
    (sample names: Prometheus stores `dstack_retries_total`, never the family `dstack_retries`)."""
    metrics = WatchMetrics()
    for i in range(2):  # two ticks, so network throughput has a rate
        metrics.observe(
            TickReport(
                started_at=1000.0 + 5 * i,
                duration_s=0.1,
                leader=True,
                runs={"task.a": "running"},
                jobs=(JobSeen(address="task.a", job_id="a-0-0-0", host="h", status="running"),),
                hosts=(HostSeen(fleet="f", host="h", reachable=True, metrics_text=agent_text(i)),),
                fleets={"f": {"busy": 1}},
                queue_depth=1,
                retries=1,
                bandwidth=(("f", "h", "h2", 1e9),),
            )
        )
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def selectors(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The metric names an expression selects, each with the label names its matchers use, and
    the label names of its `by`/`without`/`on`/`ignoring` clauses, read by a real PromQL
    parser (so a query Prometheus would reject fails here too)."""
    # Grafana fills in its interval variables before Prometheus sees the query.
    tree = promql_parser.parse(re.sub(r"\$\{?__\w+\}?", "5m", expr))
    found: list[tuple[str, set[str]]] = []
    grouping: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name for m in node.matchers.matchers}
            if node.name is None:  # {__name__="x"}
                names = [m.value for m in node.matchers.matchers if m.name == "__name__"]
                assert names, f"no metric name in {expr!r}"
                node_name = names[0]
            else:
                node_name = node.name
            found.append((node_name, labels - {"__name__"}))
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            grouping.update(node.modifier.labels)
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                grouping.update(node.modifier.matching.labels)

    promql_parser.walk(tree, visit)
    return found, grouping


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, set[str]]]:
    """(where, PromQL, label names it reads) for every panel target and query variable."""
    found: list[tuple[str, str, set[str]]] = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"], set()))
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert match, f"variable {var['name']}: expected label_values(selector, label)"
        found.append((f"variable {var['name']}", match.group(1), {match.group(2)}))
    return found


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_every_metric_and_label_the_dashboard_queries_is_one_watch_exposes(
    dashboard: dict[str, Any],
) -> None:
    names = exposed()
    problems = []
    for where, expr, reads in queries(dashboard):
        used, grouping = selectors(expr)
        assert used, f"{where}: no metric found in {expr!r}"
        labels_here: set[str] = set(TARGET_LABELS)
        for name, matcher_labels in used:
            if name not in names:
                problems.append(f"{where}: {name} is not exposed")
                continue
            labels_here |= names[name]
            for label in matcher_labels - names[name] - TARGET_LABELS:
                problems.append(f"{where}: {name} has no label {label!r}")
        for label in (grouping | reads) - labels_here:
            problems.append(f"{where}: reads label {label!r}, which no metric in it has")
    assert not problems, "\n".join(problems)


def test_every_metric_watch_exports_is_on_the_dashboard(dashboard: dict[str, Any]) -> None:
    text = WatchMetrics().render().decode()
    families = {
        f.name
        for f in text_string_to_metric_families(text)
        if not f.name.endswith("_created")  # the parser's name for a counter's start time
    }
    used = {
        name.removesuffix(suffix)
        for _, expr, _ in queries(dashboard)
        for name, _ in selectors(expr)[0]
        for suffix in ("_bucket", "_sum", "_count", "_total", "")
        if name.endswith(suffix)
    }
    assert families - used == set()


def test_the_dashboard_has_the_panels_the_issue_names_laid_out_without_overlap(
    dashboard: dict[str, Any],
) -> None:
    titles = [p["title"] for p in dashboard["panels"]]
    for wanted in (
        "GPU utilisation per host",
        "Runs by status",
        "Queue depth",
        "Retries",
        "Reconcile duration p95",
        "Instances by status",
        "Network throughput per host",
    ):
        assert wanted in titles
    assert len(set(titles)) == len(titles)
    assert len({p["id"] for p in dashboard["panels"]}) == len(titles)
    cells: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert p["datasource"]["uid"] == "${datasource}"  # the datasource variable, any Prometheus


@pytest.mark.parametrize(
    ("expr", "names", "grouping"),
    [
        ('max by (status) (dstack_runs{job=~"$job"})', [("dstack_runs", {"job"})], {"status"}),
        (
            'histogram_quantile(0.95, sum by (le) (rate(x_bucket{a="}"}[$__rate_interval])))',
            [("x_bucket", {"a"})],
            {"le"},
        ),
        ("60 * sum(rate(y_total[5m])) / on(i) z", [("y_total", set()), ("z", set())], {"i"}),
    ],
)
def test_the_query_reader_finds_metric_names_labels_and_groupings(
    expr: str, names: list[tuple[str, set[str]]], grouping: set[str]
) -> None:
    assert selectors(expr) == (names, grouping)


def test_a_query_prometheus_would_reject_fails_the_check() -> None:
    with pytest.raises(ValueError):
        selectors("sum by (host (dstack_runs)")
