"""The HTTP API's pure parts: the metrics ring's bounds over simulated hours (a FakeClock),
the OpenAPI document against the router, the token rule and `--bind`."""

from __future__ import annotations

import pytest

from dstack_plan.clock import FakeClock
from dstack_plan.errors import DstackPlanError
from dstack_plan.watch.model import HostSeen, JobSeen, TickReport
from dstack_plan.web.app import ROUTES, build_app
from dstack_plan.web.auth import authorized, needs_token
from dstack_plan.web.history import MAX_AGE, MAX_SAMPLES, History, sample_of
from dstack_plan.web.models import MetricsHistory
from dstack_plan.web.openapi import document
from dstack_plan.web.pages import PAGES
from dstack_plan.web.server import parse_bind

GPU_TEXT = "".join(
    f'dstack_agent_gpu_utilization_percent{{gpu="{i}"}} {u}\n'
    f'dstack_agent_gpu_memory_used_bytes{{gpu="{i}"}} {m}\n'
    for i, (u, m) in enumerate([(20.0, 1e9), (60.0, 3e9)])
)


def report(at: float, hosts: int = 50) -> TickReport:
    return TickReport(
        started_at=at,
        duration_s=0.1,
        leader=True,
        runs={"task.a": "running", "task.b": "pending", "task.c": "running"},
        jobs=(JobSeen(address="task.a", job_id="a-0", host="h0", status="running"),),
        hosts=tuple(
            HostSeen(fleet="f", host=f"h{i}", reachable=i > 0, metrics_text=GPU_TEXT)
            for i in range(hosts)
        ),
        queue_depth=1,
    )


def test_a_sample_keeps_per_host_figures_only() -> None:
    sample = sample_of(report(100.0, hosts=3))
    assert sample.runs == {"running": 2, "pending": 1}
    assert sample.jobs == {"running": 1}
    assert sample.gpu_utilization == {"h1": 40.0, "h2": 40.0}  # h0 did not answer
    assert sample.gpu_memory_used_bytes == {"h1": 4e9, "h2": 4e9}
    assert sample.hosts_unreachable == 1 and sample.queue_depth == 1


def test_hours_of_ticks_stay_within_the_bounds_of_count_and_age() -> None:
    clock = FakeClock()
    history = History(clock)
    one = report(0.0, hosts=2)
    for _ in range(int(10 * 3600 / 5)):  # ten hours at the default 5 s interval
        clock.advance(5.0)
        history.observe(one.model_copy(update={"started_at": clock.now()}), [])
    assert len(history) == MAX_SAMPLES
    view = history.view()
    assert clock.now() - view.samples[0].time <= MAX_AGE
    assert MetricsHistory.model_validate(view.model_dump(mode="json")) == view

    # by age: a slower watch (1 tick a minute) keeps six hours, not MAX_SAMPLES ticks
    slow = History(clock, max_samples=100_000)
    for _ in range(12 * 60):
        clock.advance(60.0)
        slow.observe(report(clock.now(), hosts=1))
    assert len(slow) == int(MAX_AGE / 60) + 1
    clock.advance(MAX_AGE + 1)  # nothing ticked since: everything expires on reading
    assert slow.view().samples == ()
    assert len(history.view(since=clock.now() - 60).samples) == 0


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        History(FakeClock(), max_samples=0)
    with pytest.raises(ValueError):
        History(FakeClock(), max_age=0)


def test_openapi_lists_every_route_of_the_router_with_resolvable_models() -> None:
    doc = document(ROUTES)
    app = build_app(source=None)  # type: ignore[arg-type]  # routes only: nothing is served
    pages = {page.path for page in PAGES} | {"/static"}  # the UI's: HTML, not the API
    served = {r.canonical for r in app.router.resources()} - pages
    assert set(doc["paths"]) == served
    schemas = doc["components"]["schemas"]
    refs = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert refs and all(r.removeprefix("#/components/schemas/") in schemas for r in refs)
    for name in ("RunView", "JobView", "FleetList", "TopView", "Event", "PlanView", "JobLogs"):
        assert name in schemas, name
    follow = doc["paths"]["/api/runs/{run}/logs"]["get"]["responses"]["200"]["content"]
    assert "text/event-stream" in follow


def test_only_loopback_proper_goes_without_a_token() -> None:
    for host in ("127.0.0.1", "::1", "[::1]", "localhost"):
        assert not needs_token(host), host
    for host in ("127.0.0.2", "0.0.0.0", "::", "10.0.0.5", "example.org"):  # noqa: S104
        assert needs_token(host), host
    assert authorized("Bearer abc", "abc") and authorized("bearer  abc ", "abc")
    for header in ("", "abc", "Basic abc", "Bearer abd", "Bearer "):
        assert not authorized(header, "abc"), header


def test_bind_reads_host_and_port() -> None:
    assert parse_bind("127.0.0.1:3000") == ("127.0.0.1", 3000)
    assert parse_bind("[::1]:0") == ("::1", 0)
    assert parse_bind("0.0.0.0:8080") == ("0.0.0.0", 8080)  # noqa: S104
    for bad in ("3000", "host:", ":3000", "::1:3000", "h:70000", "h:x"):
        with pytest.raises(DstackPlanError, match="--bind"):
            parse_bind(bad)


def test_a_right_query_token_sets_the_cookie_and_leaves_the_url() -> None:
    from aiohttp.test_utils import make_mocked_request

    from dstack_plan.web.auth import COOKIE, with_cookie

    assert with_cookie(make_mocked_request("GET", "/runs/x?token=wrong"), "tok") is None
    assert with_cookie(make_mocked_request("GET", "/runs/x"), "tok") is None
    redirect = with_cookie(make_mocked_request("GET", "/runs/x?job=1&token=tok"), "tok")
    assert redirect is not None and str(redirect.location) == "/runs/x?job=1"
    morsel = redirect.cookies[COOKIE]
    assert morsel.value == "tok" and morsel["httponly"] and morsel["samesite"] == "Strict"


def test_plan_lines_keep_the_clis_text_with_styles_as_classes() -> None:
    from dstack_plan.plan.lines import styled
    from dstack_plan.web.pages import _level, _parts

    assert _parts("plain") == [("plain", "")]
    assert _parts(("  ", styled("+", "bold green"))) == [("  ", ""), ("+", "bold green")]
    assert [_level(None), _level(None, True), _level(10), _level(99), _level(100)] == [
        "free", "held", "u0", "u3", "u3",
    ]  # fmt: skip
