"""The agent side of a rolling update (`runs/rollout.py`): starting a new replica beside
the old one, telling when it is ready, asking and removing jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from dstack_plan.agent.api_models import JobInfo, JobStatus
from dstack_plan.config.runs import ServiceSpec
from dstack_plan.errors import AgentError
from dstack_plan.plan.model import ResourceChange
from dstack_plan.providers.local import LOCAL_FLEET
from dstack_plan.runs.jobs import JobSlot
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.runs.rollout_record import job_spec_hash
from dstack_plan.runs.submission import RunSubmission, Submitted
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.apply.handlers import ApplyContext
    from dstack_plan.config.runs import RunSpec
    from dstack_plan.config.secrets import SecretStore
    from dstack_plan.fleets.machines import FleetMachines, Machine
    from dstack_plan.runs.code_archive import CodeArchive


class RunPlacer(Protocol):
    """The run handler as a rolling update uses it (`runs/handler.py`'s `RunHandler`): its
    machines, and placing and packing a run exactly as a create does."""

    machines: FleetMachines
    secrets: SecretStore

    @property
    def deployment(self) -> str: ...

    def pack_code(self, change: ResourceChange, spec: RunSpec) -> CodeArchive | None: ...

    async def place_now(
        self, fleet: str, address: str, spec: RunSpec, state: State, replicas: int | None = None
    ) -> list[Machine]: ...

    async def admit_jobs(
        self,
        address: str,
        run: RunSubmission,
        job_slots: Sequence[JobSlot],
        fleet: str,
        machines: Sequence[Machine],
        state: State,
        ctx: ApplyContext,
        replicas: int | None = None,
    ) -> list[Submitted]: ...


PORT_WAIT = 20.0
"""Seconds a running new replica gets to answer on its port before it counts as ready anyway
(a service that never listens would otherwise hold the rollout forever)."""


async def start_replica(
    handler: RunPlacer,
    entry: ResourceState,
    spec: ServiceSpec,
    replica: int,
    generation: int,
    ctx: ApplyContext,
) -> JobRecord:
    """Place and submit the new job of `replica` beside the old one."""
    record = RunRecord.of(entry)
    state = ctx.current_state()
    change = ResourceChange.in_place(entry)
    machines = await handler.place_now(record.fleet, entry.address, spec, state, replicas=1)
    slot = JobSlot(replica, 0)
    deployment = record.deployment or handler.deployment
    run = RunSubmission(
        spec, entry.name, deployment, generation, handler.secrets, handler.pack_code(change, spec)
    )
    # placed again when another project's job takes its room first, as a scale-up's replica
    submitted = await handler.admit_jobs(
        entry.address, run, [slot], record.fleet, machines, state, ctx, replicas=1
    )
    job = submitted[0]
    return JobRecord.of_job(job.info, replica, 0, host=job.machine.host)._replace(
        spec_hash=job_spec_hash(entry.spec)
    )


async def ready(info: JobInfo, fleet: str, now: float) -> bool:
    """Running, and on this machine answering on its port (for up to PORT_WAIT seconds)."""
    if info.status is not JobStatus.RUNNING:
        return False
    if fleet != LOCAL_FLEET:
        return True  # the port is on another machine: running is what can be told cheaply
    ports = [p for p in info.ports if p.host_port]
    if not ports:
        return True
    if info.started_at is not None and now - info.started_at > PORT_WAIT:
        return True
    port = ports[0]
    return await _answers(port.host_ip or "127.0.0.1", port.host_port or 0)


async def _answers(host: str, port: int) -> bool:
    """Something listens behind `host:port`. Docker's proxy accepts a connection to a
    published port even when nothing listens in the container, then closes it at once: so
    an immediate end of stream is no answer; data, or a server waiting for a request, is."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 0.5)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        closed = await asyncio.wait_for(reader.read(1), 0.3) == b""
    except asyncio.TimeoutError:
        closed = False
    except OSError:
        closed = True
    writer.close()
    return not closed


async def job_infos(handler: RunPlacer, entry: ResourceState, state: State) -> dict[str, JobInfo]:
    record = RunRecord.of(entry)
    found = {}
    for job in record.jobs:
        info = await job_info(handler, record.fleet, job, state)
        if info is not None:
            found[job.id] = info
    return found


async def job_info(handler: RunPlacer, fleet: str, job: JobRecord, state: State) -> JobInfo | None:
    agent = await handler.machines.agent(fleet, job.host, state)
    try:
        return await agent.get_job(job.id)
    except AgentError as e:
        if e.status != 404:
            raise
        return None


async def remove_jobs(handler: RunPlacer, fleet: str, jobs: list[JobRecord], state: State) -> None:
    for job in jobs:
        agent = await handler.machines.agent(fleet, job.host, state)
        try:
            await agent.delete(job.id, force=True)
        except AgentError as e:
            if e.status != 404:
                raise
        handler.machines.listings.forget(handler.machines.machine_key(fleet, job.host), [job.id])
