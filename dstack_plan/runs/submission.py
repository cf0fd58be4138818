"""Submitting a run's jobs to the agents of the machines they were placed on.

The jobs of a run go out side by side, one request per job, each to its own machine's agent.
A multi-node task honours `startup_order`: `master-first` starts the workers once the master
(node 0) runs, `workers-first` the master once every worker runs; `any` starts all at once.
Every job learns where the others are: `DSTACK_MASTER_NODE_IP` and `DSTACK_NODES_IPS` are the
addresses of the machines its nodes were placed on, in node order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from dstack_plan.agent.api_models import DiskMount, JobInfo, JobStatus
from dstack_plan.agent.client import AgentClient
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.config.runs import DevEnvironmentSpec, RunSpec, TaskSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import AgentError, ProviderError
from dstack_plan.fleets.machines import Machine
from dstack_plan.runs.code_archive import CodeArchive
from dstack_plan.runs.code_upload import ensure_code, submit_with_code
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job, run_kind, slots

PORTS_WAIT = 10.0
"""Seconds apply waits for a started container to say which host ports Docker gave it."""
STARTUP_WAIT = 600.0
"""Seconds `startup_order` waits for the first nodes to run (an image pull may be slow)."""


class PlacedJob(NamedTuple):
    """A job of a run and the machine it goes to."""

    slot: JobSlot
    machine: Machine


class Submitted(NamedTuple):
    info: JobInfo
    slot: JobSlot
    machine: Machine


class RunSubmission(NamedTuple):
    """What a run's jobs need besides their slot: who they are and where the others run."""

    spec: RunSpec
    run_name: str
    deployment: str
    generation: int
    secrets: SecretStore
    code: CodeArchive | None = None
    """The run's local files, uploaded once to each machine that gets a job."""
    disks: Mapping[JobSlot, Sequence[DiskMount]] = {}
    """The network volumes attached for each job, by slot (`runs/volume_attach.py`)."""


async def submit_jobs(
    run: RunSubmission,
    placed: Sequence[PlacedJob],
    agents: dict[str, AgentClient],
    ctx: ApplyContext,
    everyone: Sequence[PlacedJob] | None = None,
) -> list[Submitted]:
    """Submit the `placed` jobs (by their machine's host, `agents` has its client) and wait
    until each says where its ports listen.

    `everyone`: all the run's jobs with their machines, when `placed` is only the new ones (a
    scale-up); it gives the addresses of the nodes."""
    context = _context(run, everyone or placed)
    address = f"{run_kind(run.spec)}.{run.run_name}"

    code = run.code
    if code is not None:
        ctx.progress(address, f"sending {code.file_count} file(s) ({code.size} bytes)")
        hosts = {j.machine.host for j in placed}
        await asyncio.gather(*(ensure_code(agents[h], code) for h in hosts))

    # a dev environment's jobs run an SSH server that lets the project key in (`dstack attach`)
    ssh_key = dev_environment_key(run.spec, ctx.project_dir)

    async def one(job: PlacedJob) -> Submitted:
        spec = build_job(
            run.spec,
            job.slot,
            context,
            run.secrets,
            ctx.run_args,
            code=code.sha256 if code else None,
            host_gpus=job.machine.resources.gpus if job.machine.resources else (),
            disks=run.disks.get(job.slot, ()),
            ssh_public_key=ssh_key,
        )
        ctx.progress(address, f"submitting job {spec.id} to {job.machine.host}")
        info = await submit_with_code(agents[job.machine.host], spec, code)
        return Submitted(info, job.slot, job.machine)

    submitted: list[Submitted] = []
    for wave in _waves(run.spec, placed):
        # every submit of the wave answers before an error is raised: a caller that withdraws
        # the jobs after a refusal (`runs/admission.py`) finds none still on its way
        answers = await asyncio.gather(*(one(j) for j in wave), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        started = [a for a in answers if not isinstance(a, BaseException)]
        submitted += started
        if len(submitted) < len(placed):  # the next wave waits for this one to run
            await _until_running(started, agents, ctx, address)
    return list(await asyncio.gather(*(_with_host_ports(s, agents, ctx) for s in submitted)))


def dev_environment_key(spec: RunSpec, project_dir: str) -> str | None:
    """The public key a run's jobs let in over SSH: the project key's for a dev environment
    (`providers/project_key.py`, created on first use), None for tasks and services."""
    if not isinstance(spec, DevEnvironmentSpec):
        return None
    from dstack_plan.providers.project_key import project_key

    return project_key(project_dir).public_openssh


def _context(run: RunSubmission, placed: Sequence[PlacedJob]) -> JobContext:
    nodes = max((s.node for s in slots(run.spec)), default=0) + 1
    by_node = {j.slot.node: j.machine.address for j in sorted(placed, key=lambda j: j.slot)}
    first = placed[0].machine.address if placed else "127.0.0.1"
    master = by_node.get(0, first)
    return JobContext(
        run_name=run.run_name,
        run_id=f"{run.deployment}/{run.run_name}",
        generation=run.generation,
        deployment=run.deployment,
        nodes_num=nodes,
        master_ip=master,
        node_ips=tuple(by_node.get(n, master) for n in range(nodes)),
    )


def _waves(spec: RunSpec, placed: Sequence[PlacedJob]) -> list[list[PlacedJob]]:
    """The jobs in the order `startup_order` starts them: one wave, or master and workers."""
    order = spec.startup_order if isinstance(spec, TaskSpec) else "any"
    master = [j for j in placed if j.slot.node == 0]
    workers = [j for j in placed if j.slot.node != 0]
    if order == "any" or not master or not workers:
        return [list(placed)]
    return [master, workers] if order == "master-first" else [workers, master]


async def _until_running(
    jobs: Sequence[Submitted], agents: dict[str, AgentClient], ctx: ApplyContext, address: str
) -> None:
    """Wait until every job of `jobs` runs; raise if one ends first or the wait runs out."""
    deadline = ctx.clock.now() + STARTUP_WAIT
    waiting = list(jobs)
    while waiting:
        still = []
        for job in waiting:
            info = await agents[job.machine.host].get_job(job.info.id)
            if info.finished:
                raise ProviderError(
                    job.machine.fleet,
                    f"job {info.id} on {job.machine.host} ended ({info.status.value}) before "
                    "the other nodes started (startup_order)",
                    address,
                )
            if info.status is not JobStatus.RUNNING:
                still.append(job)
        waiting = still
        if waiting:
            if ctx.clock.now() >= deadline:
                names = ", ".join(j.info.id for j in waiting)
                raise ProviderError(
                    waiting[0].machine.fleet,
                    f"{names} did not start within {STARTUP_WAIT:g}s (startup_order)",
                    address,
                )
            await ctx.clock.sleep(0.2)


async def _with_host_ports(
    job: Submitted, agents: dict[str, AgentClient], ctx: ApplyContext
) -> Submitted:
    """The job as its agent knows it once it has said where its ports listen.

    Docker chooses a bridged container's host ports when it starts it, a moment after the
    submit: wait that moment (never through an image pull, at most PORTS_WAIT seconds), so
    state records where each replica listens."""
    agent = agents[job.machine.host]
    deadline = ctx.clock.now() + PORTS_WAIT
    info = job.info
    while _ports_unknown(info) and ctx.clock.now() < deadline:
        await ctx.clock.sleep(0.1)
        try:
            info = await agent.get_job(info.id)
        except AgentError as e:
            if e.status != 404:
                raise
            break
    return job._replace(info=info)


def _ports_unknown(info: JobInfo) -> bool:
    declared = info.spec.get("ports") if isinstance(info.spec, dict) else None
    if not declared:
        return False
    if info.status in (JobStatus.PULLING,) or info.finished:
        return False
    return info.status is JobStatus.SUBMITTED or any(p.host_port is None for p in info.ports)
