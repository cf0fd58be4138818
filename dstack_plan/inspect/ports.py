"""A run's ports on this machine: `dstack attach` and `apply --attach` forward them.

    async with forward_ports(project, runs, [PortOverride.parse("9000:8000")]) as opened:
        for port in opened.ports:
            print(port.url, "->", port.job, port.host, port.container_port)

Each job's ports (a service's `port`, a task's `ports`) are where its agent says they listen
on its host (`JobRecord.ports`, asked again while not known yet): a bridged container's
published 127.0.0.1 port, or the port itself for a job on the host network. A job on an SSH
host gets an SSH forward from this machine's 127.0.0.1, on the container port when it is
free, else on any free port (`--port LOCAL:CONTAINER` chooses); a job on this machine (the
local fleet) is reached where it listens, nothing forwarded. Every forward closes when the
`async with` ends; the jobs keep running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from dstack_plan.errors import AgentError, DstackPlanError
from dstack_plan.inspect.runs import FINISHED, job_agent, job_records
from dstack_plan.runs.handler import fleet_of
from dstack_plan.runs.jobs import JobSlot, container_ports
from dstack_plan.state.model import ResourceState, State

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import PublishedPort
    from dstack_plan.project import Project
    from dstack_plan.providers.ssh.forward import Forward
    from dstack_plan.runs.records import JobRecord

PORTS_WAIT = 30.0
"""Seconds to wait for the agent to say where a starting job's ports listen (a container
being created); a port still unknown then is left out, with a note."""
_POLL = 0.5
_GONE = "gone"
"""The status of a job its agent no longer knows (removed)."""
_ENDED = FINISHED | {_GONE}
_CONCURRENT = 16


@dataclass(frozen=True)
class PortOverride:
    """`--port LOCAL:CONTAINER`: forward the container port to this local port (or fail)."""

    local_port: int
    container_port: int

    @classmethod
    def parse(cls, text: str) -> PortOverride:
        """`8000:80` or `8000` (the same port here); DstackPlanError when malformed."""
        local, colon, container = text.strip().partition(":")
        try:
            ports = (int(local), int(container if colon else local))
        except ValueError:
            ports = (0, 0)
        if not all(0 < p < 65536 for p in ports):
            raise DstackPlanError(
                f"--port {text!r}: expected LOCAL:CONTAINER or PORT, ports 1-65535 (8000:80)"
            )
        return cls(*ports)

    def __str__(self) -> str:
        return f"{self.local_port}:{self.container_port}"


class JobPort(BaseModel):
    """One port of one job, and where it listens on the job's host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str
    """The run's address (`service.web`)."""
    job: str
    host: str
    """The machine it runs on, as the job records it."""
    container_port: int
    host_port: int
    """Where to connect on the host (its 127.0.0.1) to reach `container_port`."""


class ForwardedPort(BaseModel):
    """A job's port, reachable from this machine at `url`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str
    job: str
    host: str
    container_port: int
    host_port: int
    local_port: int
    forwarded: bool
    """True: an SSH forward; False: the job runs on this machine and listens there itself."""
    url: str
    """`http://127.0.0.1:<local_port>`."""


class UnknownPort(BaseModel):
    """A port of a job that has not said where it listens (still starting)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str
    job: str
    container_port: int
    status: str
    """The job's status when last asked."""

    def __str__(self) -> str:
        return (
            f"{self.job}: port {self.container_port} is not listening yet (job {self.status}); "
            "not forwarded"
        )


@dataclass
class RunPorts:
    """What `forward_ports` opened, and the ports it could not."""

    ports: list[ForwardedPort] = field(default_factory=list)
    unknown: list[UnknownPort] = field(default_factory=list)
    """The ports whose job never said where it listens (still starting)."""


async def job_ports(
    project: Project,
    run: ResourceState,
    state: State,
    *,
    wait: float = PORTS_WAIT,
    stop: asyncio.Event | None = None,
) -> tuple[list[JobPort], list[UnknownPort]]:
    """The ports of `run`'s unfinished jobs, each with where it listens on its host (asking
    the agent; while a job starts, again until `wait` seconds pass or `stop` is set), and the
    ports still not known then. Finished jobs have no ports to reach."""
    from dstack_plan.config.runs import RunSpec
    from dstack_plan.plan.normalize import spec_from_normalized

    spec = spec_from_normalized(run.kind, run.spec)
    assert isinstance(spec, RunSpec)
    limit = asyncio.Semaphore(_CONCURRENT)

    async def one(record: JobRecord) -> tuple[list[JobPort], list[UnknownPort]]:
        wanted = container_ports(spec, JobSlot(record.replica, record.node))
        if not wanted:
            return [], []
        async with limit:
            known, status = await _listening(project, run, record, state, wanted, wait, stop)
        if status in _ENDED:
            return [], []
        ports = [
            JobPort(
                run=run.address,
                job=record.id,
                host=record.host,
                container_port=port,
                host_port=known[port],
            )
            for port in wanted
            if port in known
        ]
        unknown = [
            UnknownPort(run=run.address, job=record.id, container_port=port, status=status)
            for port in wanted
            if port not in known
        ]
        return ports, unknown

    found = await asyncio.gather(*(one(r) for r in job_records(run)))
    return [p for ports, _ in found for p in ports], [u for _, unknown in found for u in unknown]


async def _listening(
    project: Project,
    run: ResourceState,
    record: JobRecord,
    state: State,
    wanted: Sequence[int],
    wait: float,
    stop: asyncio.Event | None,
) -> tuple[dict[int, int], str]:
    """Container port -> host port for the `wanted` ports known now, and the job's status."""
    agent = await job_agent(project, run, record, state)
    clock = project.clock
    deadline = clock.now() + wait
    ports: Sequence[PublishedPort] = record.ports
    while True:
        try:
            info = await agent.get_job(record.id)
        except AgentError as e:
            if e.status != 404:
                raise
            return {}, _GONE  # removed from its host: nothing listens
        status = info.status.value
        ports = info.ports or ports
        known = {p.container_port: p.host_port for p in ports if p.host_port is not None}
        if all(p in known for p in wanted) or status in FINISHED:
            return known, status
        if clock.now() >= deadline or (stop is not None and stop.is_set()):
            return known, status
        await clock.sleep(_POLL)


@asynccontextmanager
async def forward_ports(
    project: Project,
    runs: Sequence[ResourceState],
    overrides: Sequence[PortOverride] = (),
    *,
    wait: float = PORTS_WAIT,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[RunPorts]:
    """Make every port of `runs`' jobs reachable on this machine's 127.0.0.1 for the body.

    An override applies to the first job listening on its container port (replica 0 of a
    service); a port it names that no job has, or a local port it names that is in use, is a
    DstackPlanError. Without one, the local port is the container port when free, else any
    free port. Everything opened is closed when the body ends (also on an error).
    """
    state = project.backend.read().state
    found = [await job_ports(project, run, state, wait=wait, stop=stop) for run in runs]
    ports = [p for listed, _ in found for p in listed]
    opened = RunPorts(unknown=[u for _, unknown in found for u in unknown])
    chosen = _assign(ports, overrides, runs)
    fleets = {run.address: fleet_of(run) for run in runs}
    forwards: list[Forward] = []
    try:
        for port in ports:
            override = chosen.get((port.job, port.container_port))
            forward = await _open(project, fleets[port.run], port, state, override)
            forwards.append(forward)
            if override is not None and forward.local_port != override.local_port:
                raise DstackPlanError(
                    f"--port {override}: {port.job} runs on this machine, where port "
                    f"{port.container_port} listens on 127.0.0.1:{forward.local_port} already; "
                    "nothing is forwarded on the local fleet: leave --port out"
                )
            opened.ports.append(_view(port, forward))
        yield opened
    finally:
        for forward in forwards:
            await forward.close()


def _assign(
    ports: Sequence[JobPort], overrides: Sequence[PortOverride], runs: Sequence[ResourceState]
) -> dict[tuple[str, int], PortOverride]:
    """(job, container port) -> the override it takes: each override the first match."""
    chosen: dict[tuple[str, int], PortOverride] = {}
    for override in overrides:
        match = next(
            (
                p
                for p in ports
                if p.container_port == override.container_port
                and (p.job, p.container_port) not in chosen
            ),
            None,
        )
        if match is None:
            names = ", ".join(r.address for r in runs)
            listed = ", ".join(sorted({str(p.container_port) for p in ports})) or "none"
            raise DstackPlanError(
                f"--port {override}: no job of {names} listens on port "
                f"{override.container_port} (its ports: {listed})"
            )
        chosen[(match.job, match.container_port)] = override
    return chosen


async def _open(
    project: Project, fleet: str, port: JobPort, state: State, override: PortOverride | None
) -> Forward:
    machines = project.machines
    if override is not None:
        try:
            return await machines.forward(
                fleet, port.host, state, port.host_port, override.local_port
            )
        except OSError as e:
            raise DstackPlanError(
                f"--port {override}: cannot listen on 127.0.0.1:{override.local_port} "
                f"({e.strerror or e}): is something else using it? Pick another local port"
            ) from None
    try:
        return await machines.forward(fleet, port.host, state, port.host_port, port.container_port)
    except OSError:  # the container port is taken here (or privileged): any free one
        return await machines.forward(fleet, port.host, state, port.host_port, 0)


def _view(port: JobPort, forward: Forward) -> ForwardedPort:
    return ForwardedPort(
        **port.model_dump(),
        local_port=forward.local_port,
        forwarded=forward.forwarded,
        url=f"http://127.0.0.1:{forward.local_port}",
    )
