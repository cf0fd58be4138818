"""Runs as they are now: state entries refreshed live from their agents, nothing written.

`list_runs` backs `dstack ps`; `find_run` resolves what a user typed (`hello` or `task.hello`)
for `logs` and `stop`. The JSON form of `RunView` (`model_dump(mode="json")`) is the stable
output of `dstack ps --json`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from dstack_plan.agent.api_models import PublishedPort
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.errors import AgentError, ProviderError
from dstack_plan.inspect.notes import run_notes
from dstack_plan.inspect.resources import find_entry
from dstack_plan.runs.attempts import Attempt, attempts_of, current_attempt
from dstack_plan.runs.handler import fleet_of
from dstack_plan.runs.records import JobRecord, RunRecord, served_now, service_url
from dstack_plan.runs.scaling import ScalingRecord
from dstack_plan.state.lease import leader
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import JobInfo
    from dstack_plan.agent.client import AgentClient
    from dstack_plan.agent.jobs_api import JobsAPI
    from dstack_plan.apply.handlers import Refreshed
    from dstack_plan.project import Project

FINISHED = frozenset({"done", "failed", "terminated", "aborted"})
RECENT_SECONDS = 3600.0
"""Without `--all`, `ps` still shows runs that finished less than this long ago."""


class JobView(BaseModel):
    """One job of a run: a node of a task or a replica of a service."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    status: str
    exit_code: int | None = None
    termination_reason: str | None = None
    """Why the job ended, as its agent says (`max_duration_exceeded`...)."""
    termination_message: str | None = None
    replica: int
    node: int
    host: str
    gpus: list[int] = []
    """GPU indices the agent allocated on its host."""
    gpu_share: int | None = None
    """Thousandths of its GPU the job holds, when it shares one (None: whole GPUs)."""
    gpu_sharing: str | None = None
    """How the agent shares that GPU: `mps` (limits enforced) or `time-slicing` (none)."""
    ports: list[PublishedPort] = []
    """Where the job's ports listen on its host (`127.0.0.1:49153 -> 8799`)."""
    started_at: datetime | None = None
    finished_at: datetime | None = None


class AttemptView(BaseModel):
    """One submission of a run (`runs/attempts.py`): an earlier one watch's retry replaced,
    kept with its jobs and their logs, or the latest (the run's current jobs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempt: int
    """1 for the first submission (`dstack logs RUN --attempt N`)."""
    status: str
    reason: str | None = None
    """Why it ended: its first failed job's `reason: message`, or the run's termination
    reason."""
    hosts: list[str] = []
    jobs: list[JobView] = []
    ended_at: datetime | None = None


class RunView(BaseModel):
    """A run for display: status and jobs as the agents report them now."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str
    kind: str
    name: str
    status: str
    fleet: str
    hosts: list[str]
    gpus: str | None
    """The GPUs each job asks for (`A100:80GB:2`); None when it asks for none."""
    price_per_hour: float
    created_at: datetime
    finished_at: datetime | None = None
    """When the last job ended, for a finished run."""
    error: str | None = None
    """Why the status could not be refreshed (agent unreachable, jobs gone): it is as of the
    last apply."""
    failure: str | None = None
    """For a failed run, why its first failed job failed: `reason: message` from its agent."""
    jobs: list[JobView] = []
    notes: list[str] = []
    """What watch or apply is doing about it, from its state: `retrying at 12:03:15`,
    `waiting for capacity: ...`, `next run 04:00`, a service's scaling, a rolling update."""
    url: str | None = None
    """A service's URL on the proxy of the `dstack watch` that serves it."""
    scaling: ScalingRecord | None = None
    """A service's autoscaling: desired and wanted replicas, the rate, what holds it."""
    attempts: list[AttemptView] = []
    """Its submissions, oldest first, once watch's retry resubmitted it: those it replaced
    (the last ten are kept) and the latest, its current jobs (`jobs`); empty for a run
    submitted once."""

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def run_entries(state: State) -> list[ResourceState]:
    """The runs (tasks, services, dev environments) in a state, by address."""
    return [r for a, r in sorted(state.resources.items()) if r.kind in RUN_KINDS]


def find_run(state: State, ref: str) -> ResourceState:
    """The run `ref` names: an address (`task.hello`) or a bare name (`hello`).

    Raises DstackPlanError listing the known runs when there is no such run or a bare name
    matches runs of several kinds.
    """
    return find_entry(state, ref, RUN_KINDS, noun="run")


async def job_agent(
    project: Project, run: ResourceState, job: JobRecord, state: State | None = None
) -> AgentClient:
    """The agent of the machine `job` of `run` runs on, as the run handler reaches it (the
    fleet's machines are found in `state`, default the stored one): for what needs the
    host itself (its ports, an SSH session); `job_jobs` for reading and ending the job."""
    if state is None:
        state = project.backend.read().state
    return await project.machines.agent(fleet_of(run), job.host, state)


async def job_jobs(
    project: Project, run: ResourceState, job: JobRecord, state: State | None = None
) -> JobsAPI:
    """What runs `job` of `run` (its machine's agent, or a Slurm fleet's cluster), as the
    run handler reaches it: for its status, output and stop."""
    if state is None:
        state = project.backend.read().state
    return await project.machines.jobs_api(fleet_of(run), job.host, state)


def job_records(run: ResourceState) -> list[JobRecord]:
    """The jobs recorded in a run's state attributes, in (replica, node) order."""
    return sorted(RunRecord.of(run).jobs, key=lambda r: r.slot)


async def list_runs(
    project: Project,
    *,
    all_runs: bool = False,
    addresses: set[str] | None = None,
    now: float | None = None,
) -> list[RunView]:
    """The runs in the project's state, refreshed from their agents; newest first.

    Without `all_runs`, finished runs are left out unless they finished less than
    RECENT_SECONDS ago. `addresses` limits the listing. Each fleet's agent is asked once for
    all its runs; runs whose agent cannot be asked keep their last recorded status and say
    why in `error`, and the others are still listed. Tainted runs are shown as recorded.
    """
    state = project.backend.read().state
    now = project.clock.now() if now is None else now
    by_fleet: dict[str, list[ResourceState]] = {}
    for run in run_entries(state):
        if addresses is None or run.address in addresses:
            by_fleet.setdefault(fleet_of(run), []).append(run)
    # a service's URL is the proxy of the watch that recorded it: it answers while it leads;
    # a retry is made by whichever watch leads. Only those notes need the lease read.
    leading = None
    if any(_needs_watch(r) for rs in by_fleet.values() for r in rs):
        record = leader(project.backend, now)
        leading = record.holder if record is not None else None
    views: list[RunView] = []
    for fleet, runs in by_fleet.items():
        views += await _fleet_views(project, fleet, runs, leading)
    kept = [
        v
        for v in views
        if all_runs or not v.finished or _ended_recently(v, state.resources[v.address], now)
    ]
    kept.sort(key=lambda v: (-v.created_at.timestamp(), v.address))
    return kept


def _needs_watch(run: ResourceState) -> bool:
    """Whether what `ps` says of `run` depends on a watch leading: a service is served by
    one, a run with a `retry` policy is retried by one."""
    return run.kind == "service" or bool(run.spec.get("retry"))


async def _fleet_views(
    project: Project, fleet: str, runs: list[ResourceState], leading: str | None
) -> list[RunView]:
    from dstack_plan.apply.records import for_handler

    live = [for_handler(r) for r in runs if not r.tainted]
    found: dict[str, Refreshed] = {}
    infos: dict[str, JobInfo] = {}
    error = None
    try:
        if live:
            # every run kind has the same handler: one refresh_many asks the agent once
            handler = project.handlers()[live[0].kind]
            found = await handler.refresh_many(live, project.context())
    except (AgentError, ProviderError) as e:
        error = str(e)
    state = project.backend.read().state
    # each host once; one that cannot be asked (down, or gone from the fleet) marks only the
    # runs with jobs there
    failed: dict[str, str] = {}
    asked: set[str] = set()
    for run in live:
        for job in job_records(run):
            if job.host in asked:
                continue
            asked.add(job.host)
            try:
                agent = await job_jobs(project, run, job, state)
                infos.update({j.id: j for j in await agent.list_jobs()})
            except (AgentError, ProviderError) as e:
                failed[job.host] = str(e)
    return [
        _view(run, found.get(run.address), infos, error or _host_errors(run, failed), leading)
        for run in runs
    ]


def _host_errors(run: ResourceState, failed: dict[str, str]) -> str | None:
    """Why some of `run`'s hosts could not be asked, unless it had finished (its recorded
    status is final then: nothing an agent says would change it)."""
    if run.status in FINISHED:
        return None
    hosts = sorted({j.host for j in job_records(run) if j.host in failed})
    return "; ".join(dict.fromkeys(failed[h] for h in hosts)) or None


def _view(
    run: ResourceState,
    found: Refreshed | None,
    infos: dict[str, JobInfo],
    error: str | None,
    leading: str | None,
) -> RunView:
    """`leading`: the lease holder id of the watch that leads now (None: none does)."""
    served = served_now(run, leading)
    status, attributes = run.status, dict(run.attributes)
    if found is not None:
        status, attributes, error = found.status, found.attributes, error or found.gone
    if run.tainted:
        error = "tainted: its creation did not complete; the next apply replaces it"
    records = job_records(run.model_copy(update={"attributes": attributes}))
    jobs = [_job_view(r, infos.get(r.id)) for r in records]
    ends = [j.finished_at for j in jobs if j.finished_at is not None]
    finished_at = max(ends) if ends and status in FINISHED else None
    failure = _failure(jobs) if status == "failed" else None
    attempts = [_attempt_view(a) for a in attempts_of(attributes)]
    if attempts:  # resubmitted: the current jobs are its latest attempt
        reason = failure or attributes.get("termination_reason")
        attempts.append(
            AttemptView(
                attempt=current_attempt(attributes),
                status=status,
                reason=reason if isinstance(reason, str) else None,
                hosts=sorted({j.host for j in jobs}),
                jobs=jobs,
                ended_at=finished_at,
            )
        )
    return RunView(
        address=run.address,
        kind=run.kind,
        name=run.name,
        status=status,
        fleet=fleet_of(run),
        hosts=sorted({j.host for j in jobs}),
        gpus=_gpu_request(run),
        price_per_hour=RunRecord.of(run).price_per_hour,
        created_at=run.created_at,
        finished_at=finished_at,
        error=error,
        failure=failure,
        jobs=jobs,
        notes=run_notes(run, attributes, served, watching=leading is not None, status=status),
        url=service_url(run) if served else None,
        scaling=ScalingRecord.of(run.attributes) if run.kind == "service" else None,
        attempts=attempts,
    )


def _attempt_view(attempt: Attempt) -> AttemptView:
    """An ended attempt as recorded (its jobs ended: their agents are not asked)."""
    return AttemptView(
        attempt=attempt.attempt,
        status=attempt.status,
        reason=attempt.reason,
        hosts=attempt.hosts,
        jobs=[_ended_job_view(r) for r in sorted(attempt.jobs, key=lambda r: r.slot)],
        ended_at=_utc(attempt.ended_at),
    )


def _failure(jobs: list[JobView]) -> str | None:
    for job in jobs:
        if job.status == "failed" and (job.termination_reason or job.termination_message):
            parts = [job.termination_reason, job.termination_message]
            return ": ".join(p for p in parts if p)
    return None


def _ended_job_view(record: JobRecord) -> JobView:
    """A job of an ended attempt, as recorded when it ended."""
    reason, _, message = (record.reason or "").partition(": ")
    return _job_view(record, None).model_copy(
        update={
            "termination_reason": reason or None,
            "termination_message": message or None,
            "started_at": _utc(record.started_at),
            "finished_at": _utc(record.finished_at),
        }
    )


def _job_view(record: JobRecord, info: JobInfo | None) -> JobView:
    return JobView(
        id=record.id,
        status=info.status.value if info else record.status,
        exit_code=info.exit_code if info else None,
        termination_reason=_reason(info),
        termination_message=info.termination_message if info else None,
        replica=record.replica,
        node=record.node,
        host=record.host,
        gpus=list(info.gpus) if info else [],
        gpu_share=info.gpu_share if info else None,
        gpu_sharing=info.gpu_sharing if info else None,
        ports=list(info.ports) if info and info.ports else list(record.ports),
        started_at=_utc(info.started_at) if info else None,
        finished_at=_utc(info.finished_at) if info else None,
    )


def _reason(info: JobInfo | None) -> str | None:
    if info is None or info.termination_reason is None:
        return None
    return info.termination_reason.value


def _utc(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.utc)


def _ended_recently(view: RunView, run: ResourceState, now: float) -> bool:
    # Without job records from the agent, the last state update is the best finish time known.
    ended = view.finished_at or run.updated_at
    return now - ended.timestamp() < RECENT_SECONDS


def _gpu_request(run: ResourceState) -> str | None:
    from dstack_plan.config.gpu import GPUSpec

    resources = run.spec.get("resources")
    gpu = resources.get("gpu") if isinstance(resources, dict) else None
    if gpu is None:
        return None
    try:
        spec = GPUSpec.model_validate(gpu)
    except ValueError:
        return str(gpu)
    if not spec.count.min:  # the scheduler gives a job the lower bound: none
        return None
    if isinstance(gpu, dict):  # the object form (total_memory...) has no shorthand
        what = ",".join(spec.name or ()) or (spec.vendor.value if spec.vendor else "gpu")
        return f"{what}:{gpu.get('count', spec.count.min)}"
    return str(gpu)
