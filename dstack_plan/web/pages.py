"""The web UI: server-rendered pages (Jinja2 templates in `templates/`) over the same
`ApiSource` the API routes read, so a page shows what `/api/...` answers.

Every page is whole without JavaScript (a `<meta http-equiv=refresh>` keeps list pages fresh).
With JavaScript, htmx polls the page's own URL with `HX-Request: true` every two seconds and
this answers only the template's `live` block, which replaces the one on screen; a run's log
follows the API's server-sent events (`static/ui.js`); the chart page draws
`/api/metrics/history` with uPlot. Every value a template prints goes through the source's
`redact` (the environment's `finalize`), as every API answer does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from aiohttp import web
from aiohttp.typedefs import Handler

from dstack_plan.errors import DstackPlanError
from dstack_plan.web.routing import attempt, flag, number, since, source_of
from dstack_plan.web.source import ApiSource
from dstack_plan.web.wording import format_age, job_status_text, run_gpus

if TYPE_CHECKING:
    from dstack_plan.inspect.runs import AttemptView, JobView, RunView
    from dstack_plan.inspect.top import HostTop
    from dstack_plan.plan.lines import Line
    from dstack_plan.web.models import MetricsSample

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
TEMPLATES = web.AppKey("templates", jinja2.Environment)
POLL = "2s"
"""How often htmx asks for a page's live part again."""
REFRESH_S = 10
"""Without JavaScript, list pages reload themselves this often."""
EVENTS_SHOWN = 200
RUN_EVENTS_SHOWN = 50
SAMPLES_SHOWN = 30
"""The last metrics samples the chart page lists as a table (the no-JS view)."""


@dataclass(frozen=True)
class Page:
    path: str
    handler: Handler
    title: str
    nav: bool = True
    """Listed in the navigation bar."""


def environment(source: ApiSource) -> jinja2.Environment:
    """The templates, every printed value redacted by `source`."""

    def finalize(value: Any) -> Any:
        return source.redact(value) if isinstance(value, str) else value

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        finalize=finalize,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["age"] = _age
    env.filters["money"] = lambda value: f"${value:.2f}/h"
    env.filters["clock"] = lambda at: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    env.filters["gib"] = lambda n: f"{n / 2**30:.1f} GiB"
    env.globals["nav"] = [p for p in PAGES if p.nav]
    env.globals["poll"] = POLL
    return env


def render(request: web.Request, template: str, code: int = 200, **context: Any) -> web.Response:
    """The page `template`, or only its `live` block when htmx asks (`HX-Request`)."""
    env = request.app[TEMPLATES]
    page = env.get_template(template)
    context.update(request=request, here=request.path_qs, refresh=context.get("refresh"))
    if request.headers.get("HX-Request") and "live" in page.blocks:
        text = "".join(page.blocks["live"](page.new_context(context)))
    else:
        text = page.render(context)
    return web.Response(
        text=source_of(request).redact(text), status=code, content_type="text/html"
    )


def error_page(request: web.Request, status: int, message: str) -> web.Response:
    return render(
        request, "error.html", code=status, title="Error", status_code=status, message=message
    )


# -- pages ---------------------------------------------------------------------------------


async def runs_page(request: web.Request) -> web.Response:
    source = source_of(request)
    all_runs = flag(request, "all")
    views = await source.runs(all_runs=all_runs)
    namespaces = source.namespaces()
    status = request.query.get("status", "")
    namespace = request.query.get("namespace", "")
    shown = [
        v
        for v in views
        if (not status or v.status == status)
        and (not namespace or namespaces.get(v.address) == namespace)
    ]
    now = source.project.clock.now()
    return render(
        request,
        "runs.html",
        title="Runs",
        refresh=REFRESH_S,
        rows=[_run_row(v, namespaces.get(v.address, ""), now) for v in shown],
        total=len(views),
        status=status,
        namespace=namespace,
        all_runs=all_runs,
        statuses=sorted({v.status for v in views} | {status} - {""}),
        namespaces=sorted(set(namespaces.values()) | {namespace} - {""}),
    )


async def run_page(request: web.Request) -> web.Response:
    from dstack_plan.web import logs as job_logs

    source = source_of(request)
    ref = request.match_info["run"]
    view = await source.run(ref)
    replica, job = number(request, "replica", 0), number(request, "job", 0)
    which = attempt(request)
    now = source.project.clock.now()
    events = source.events(None, view.address, RUN_EVENTS_SHOWN)
    context: dict[str, Any] = dict(
        title=view.address,
        refresh=None if request.headers.get("HX-Request") else REFRESH_S,
        run=_run_row(view, source.namespaces().get(view.address, ""), now),
        jobs=[_job_row(j, now) for j in view.jobs],
        events=events,
        replica=replica,
        job=job,
        attempt=which,
        attempts=[_attempt_row(a, view) for a in reversed(view.attempts)],
    )
    if request.headers.get("HX-Request"):  # the live block does not show the log
        return render(request, "run.html", logs=None, log_error=None, follow=False, **context)
    logs, log_error = None, None
    try:
        logs = await job_logs.job_logs(source, view.address, replica, job, which)
    except DstackPlanError as e:
        log_error = str(e)
    follow = logs is not None and logs.status not in FINISHED_JOBS
    return render(request, "run.html", logs=logs, log_error=log_error, follow=follow, **context)


async def fleets_page(request: web.Request) -> web.Response:
    source = source_of(request)
    fleets = await source.fleets()
    top = await source.hosts()
    views = await source.runs()
    history = source.metrics(None)
    last = history.samples[-1] if history.samples else None
    return render(
        request,
        "fleets.html",
        title="Fleets and hosts",
        refresh=REFRESH_S,
        fleets=fleets.fleets,
        taken_at=top.taken_at,
        hosts=[_host_card(h, views, last) for h in top.hosts],
        recording=history.recording,
    )


async def metrics_page(request: web.Request) -> web.Response:
    history = source_of(request).metrics(None)
    samples = history.samples[-SAMPLES_SHOWN:]
    return render(
        request,
        "metrics.html",
        title="GPU use and queue",
        refresh=REFRESH_S,
        recording=history.recording,
        kept=len(history.samples),
        rows=[_sample_row(s) for s in reversed(samples)],
    )


async def events_page(request: web.Request) -> web.Response:
    address = request.query.get("address") or None
    found = source_of(request).events(
        since(request), address, number(request, "limit", EVENTS_SHOWN)
    )
    return render(
        request,
        "events.html",
        title="Events",
        refresh=REFRESH_S,
        events=list(reversed(found)),
        address=address or "",
        since_text=request.query.get("since", ""),
    )


async def plan_page(request: web.Request) -> web.Response:
    from dstack_plan.plan.render import render_plan

    view = await source_of(request).plan()
    return render(
        request,
        "plan.html",
        title="Plan",
        computed_at=view.computed_at,
        lines=[_parts(line) for line in render_plan(view.plan)],
    )


PAGES: tuple[Page, ...] = (
    Page("/", runs_page, "Runs"),
    Page("/runs/{run}", run_page, "Run", nav=False),
    Page("/fleets", fleets_page, "Fleets & hosts"),
    Page("/metrics", metrics_page, "Charts"),
    Page("/events", events_page, "Events"),
    Page("/plan", plan_page, "Plan"),
)


def add_pages(app: web.Application, source: ApiSource) -> None:
    app[TEMPLATES] = environment(source)
    for page in PAGES:
        app.router.add_get(page.path, page.handler)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)


# -- what the templates read ---------------------------------------------------------------

FINISHED_JOBS = frozenset({"done", "failed", "terminated", "aborted"})
"""Job statuses after which a log grows no more."""


def _age(seconds: float) -> str:
    return format_age(seconds)


def _run_row(view: RunView, namespace: str, now: float) -> dict[str, Any]:
    return dict(
        address=view.address,
        name=view.name,
        kind=view.kind,
        status=view.status,
        fleet=view.fleet,
        hosts=", ".join(view.hosts) or "-",
        gpus=run_gpus(view),
        price=view.price_per_hour,
        age=now - view.created_at.timestamp(),
        namespace=namespace,
        error=view.error,
        failure=view.failure,
        notes=view.notes,
        url=view.url,
    )


def _attempt_row(attempt: AttemptView, view: RunView) -> dict[str, Any]:
    """One submission of the run, with a link to each of its jobs' logs."""
    latest = attempt.attempt == view.attempts[-1].attempt
    return dict(
        attempt=attempt.attempt,
        latest=latest,
        status=attempt.status,
        reason=attempt.reason or "",
        hosts=", ".join(attempt.hosts) or "-",
        ended_at=attempt.ended_at.timestamp() if attempt.ended_at else None,
        jobs=[
            dict(
                id=j.id,
                # the latest attempt's logs are the page's own (no `attempt`: it follows on)
                query=f"replica={j.replica}&job={j.node}"
                + ("" if latest else f"&attempt={attempt.attempt}"),
            )
            for j in attempt.jobs
        ],
    )


def _job_row(job: JobView, now: float) -> dict[str, Any]:
    return dict(
        id=job.id,
        replica=job.replica,
        node=job.node,
        status=job.status,
        status_text=job_status_text(job),
        host=job.host,
        gpus=",".join(str(g) for g in job.gpus) or "-",
        ports=", ".join(str(p) for p in job.ports) or "-",
        age=now - job.started_at.timestamp() if job.started_at else None,
        reason=": ".join(x for x in (job.termination_reason, job.termination_message) if x),
    )


def _host_card(host: HostTop, views: list[RunView], last: MetricsSample | None) -> dict[str, Any]:
    """A host with one cell per GPU: the run on it, and the host's GPU utilisation (watch
    samples it per host: the mean of its GPUs) as the cell's colour."""
    users: dict[int, str] = {}
    for view in views:
        for job in view.jobs:
            if job.host == host.host and job.status not in FINISHED_JOBS:
                for index in job.gpus:
                    users[index] = view.name
    utilization = last.gpu_utilization.get(host.host) if last else None
    memory = last.gpu_memory_used_bytes.get(host.host) if last else None
    gpus = [
        dict(index=i, name=name, run=users.get(i), level=_level(utilization, i in users))
        for i, name in enumerate(host.gpu_names)
    ]
    return dict(
        host=host, gpus=gpus, utilization=utilization, memory=memory, level=_level(utilization)
    )


def _level(utilization: float | None, allocated: bool = False) -> str:
    """The colour class of a utilisation: u0 (idle) to u3 (busy); without a figure, whether
    a job holds it."""
    if utilization is None:
        return "held" if allocated else "free"
    return f"u{min(3, int(utilization // 25))}"


def _sample_row(sample: MetricsSample) -> dict[str, Any]:
    values = list(sample.gpu_utilization.values())
    return dict(
        time=sample.time,
        queue=sample.queue_depth,
        running=sample.runs.get("running", 0),
        utilization=sum(values) / len(values) if values else None,
        memory=sum(sample.gpu_memory_used_bytes.values()),
        unreachable=sample.hosts_unreachable,
    )


def _parts(line: Line) -> list[tuple[str, str]]:
    """A line of the CLI's rendering as (text, CSS class) parts: its rich styles as classes."""
    if isinstance(line, str):
        return [(line, "")]
    return [
        (part, "") if isinstance(part, str) else (part[0], " ".join(part[1].split()))
        for part in line
    ]
