"""`dstack top`: every host's GPUs, memory, CPU and tasks, asked of its agent now.

    sampler = TopSampler(project.machines, project.clock)
    view = await sampler.snapshot(project.backend.read().state)   # again for the next frame

The hosts are those of every SSH fleet in state, and this machine (the `local` fleet) when
state has runs placed on it or there is no SSH fleet at all: a team watching its servers does
not want a row for the laptop it runs `top` from, and a project that only runs locally wants
that row. All hosts are asked side by side; a host that does not answer is a row with why,
never a failure of the command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dstack_plan.agent.client import AgentClient
from dstack_plan.clock import Clock
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.errors import AgentError, DstackPlanError
from dstack_plan.fleets.machines import FleetMachines, Machine
from dstack_plan.inspect.top_sample import HostReading, cpu_percent, reading
from dstack_plan.providers.local import LOCAL_FLEET
from dstack_plan.providers.names import HOST_FLEET_PROVIDERS
from dstack_plan.runs.records import RunRecord
from dstack_plan.sharing.imports import imported_fleet_names
from dstack_plan.state.model import State

CPU_WINDOW = 0.5
"""Seconds between the two readings a host's first CPU figure is measured over."""
HOST_TIMEOUT = 15.0
"""Seconds a host gets to answer (an SSH connection, and the agent's install check)."""


class HostTop(BaseModel):
    """One host's row (`--json` prints these under `hosts`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str
    host: str
    """As the fleet names it (`dstack fleet list`, `ps`): `hostname` or `hostname:port`."""
    agent: Literal["ok", "error"]
    error: str | None
    """Why the host did not answer (unreachable, agent down); None when it did."""
    gpus_used: int | None
    """GPUs allocated to jobs now; None when the host did not answer."""
    gpus_total: int | None
    """The GPUs the agent sees; when the host did not answer, those state recorded."""
    gpu_names: tuple[str, ...]
    """One name per GPU, as the fleet's last check recorded them."""
    memory_percent: float | None
    cpu_percent: float | None
    """The host's CPU time spent working since the previous reading (all CPUs, 0-100)."""
    tasks: int | None
    """Jobs on the host that have not finished (of any project its agent serves)."""
    runs: tuple[str, ...]
    """The run name of each of those jobs, oldest first."""


class TopView(BaseModel):
    """One snapshot of every host (`dstack top --json`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    taken_at: float
    """Seconds since the epoch."""
    hosts: tuple[HostTop, ...]
    """Fleet by fleet (`local` first), each fleet's hosts in its order."""


def top_fleets(state: State) -> list[str]:
    """The fleets `top` shows, in order: `local` when state has a run placed on it or has no
    SSH fleet, then every SSH fleet in state."""
    ssh = [
        entry.address.split(".", 1)[1]
        for entry in state.resources.values()
        if entry.kind == "fleet" and entry.provider in HOST_FLEET_PROVIDERS and not entry.tainted
    ]
    local_runs = any(
        entry.kind in RUN_KINDS and RunRecord.of(entry).fleet == LOCAL_FLEET
        for entry in state.resources.values()
    )
    return ([LOCAL_FLEET] if local_runs or not ssh else []) + ssh


def host_row(
    fleet: str,
    host: str,
    gpu_names: Sequence[str],
    before: HostReading,
    after: HostReading,
) -> HostTop:
    """The row of a host that answered, from two readings (`before` is the earlier)."""
    return HostTop(
        fleet=fleet,
        host=host,
        agent="ok",
        error=None,
        gpus_used=after.gpus_used,
        gpus_total=after.gpus_total,
        gpu_names=tuple(gpu_names),
        memory_percent=after.memory_percent,
        cpu_percent=cpu_percent(before, after),
        tasks=len(after.runs),
        runs=after.runs,
    )


def error_row(fleet: str, host: str, gpu_names: Sequence[str], error: str) -> HostTop:
    """The row of a host that did not answer (or of a fleet whose hosts are not known,
    with `host` empty)."""
    return HostTop(
        fleet=fleet,
        host=host,
        agent="error",
        error=error,
        gpus_used=None,
        gpus_total=len(gpu_names) if gpu_names else None,
        gpu_names=tuple(gpu_names),
        memory_percent=None,
        cpu_percent=None,
        tasks=None,
        runs=(),
    )


class TopSampler:
    """Takes snapshots of the hosts; keeps each host's last reading, so every snapshot after
    the first measures CPU use since the one before without waiting."""

    def __init__(
        self,
        machines: FleetMachines,
        clock: Clock,
        *,
        cpu_window: float = CPU_WINDOW,
        timeout: float = HOST_TIMEOUT,
        parallelism: int = 32,
    ):
        self.machines = machines
        self.clock = clock
        self.cpu_window = cpu_window
        self.timeout = timeout
        self._limit = asyncio.Semaphore(max(1, parallelism))
        self._last: dict[tuple[str, str], HostReading] = {}

    async def snapshot(self, state: State) -> TopView:
        """Every host of `top_fleets(state)`, then of the fleets other projects export to
        this one (`owner/name`), asked now."""
        asks: list[Awaitable[HostTop]] = []
        for fleet in top_fleets(state) + imported_fleet_names(self.machines.imports):
            try:
                found = await self.machines.machines(fleet, state)
            except DstackPlanError as e:
                asks.append(_ready(error_row(fleet, "", (), str(e))))
                continue
            asks.extend(self._bounded(m, state) for m in found)
        rows = await asyncio.gather(*asks)
        return TopView(taken_at=self.clock.now(), hosts=tuple(rows))

    async def _bounded(self, machine: Machine, state: State) -> HostTop:
        async with self._limit:
            return await self._host(machine, state)

    async def _host(self, machine: Machine, state: State) -> HostTop:
        key = (machine.fleet, machine.host)
        names = [g.name for g in machine.resources.gpus] if machine.resources else []
        try:
            before, after = await asyncio.wait_for(
                self._readings(machine, state, self._last.get(key)), self.timeout
            )
        except DstackPlanError as e:
            self._last.pop(key, None)
            return error_row(machine.fleet, machine.host, names, _reason(e, machine.host))
        except asyncio.TimeoutError:
            self._last.pop(key, None)
            error = f"no answer within {self.timeout:g}s"
            return error_row(machine.fleet, machine.host, names, error)
        self._last[key] = after
        return host_row(machine.fleet, machine.host, names, before, after)

    async def _readings(
        self, machine: Machine, state: State, previous: HostReading | None
    ) -> tuple[HostReading, HostReading]:
        agent = await self.machines.agent(machine.fleet, machine.host, state)
        now = await _read(agent)
        if previous is not None:
            return previous, now
        await self.clock.sleep(self.cpu_window)  # CPU use is a rate: it needs two readings
        return now, await _read(agent)


async def _read(agent: AgentClient) -> HostReading:
    metrics, jobs = await asyncio.gather(agent.metrics(), agent.list_jobs())
    return reading(metrics, jobs)


async def _ready(row: HostTop) -> HostTop:
    return row


def _reason(error: DstackPlanError, host: str) -> str:
    """The error without the host's name in front: the row names the host."""
    detail = getattr(error, "detail", None)
    if isinstance(detail, str):
        return detail
    text = str(error)
    if isinstance(error, AgentError) and text.startswith(f"{error.host}: "):
        return text[len(error.host) + 2 :]
    return text.removeprefix(f"{host}: ")


HEADERS = ("NODE", "FLEET", "GPUS", "MEM", "CPU", "TASKS")


def table_rows(view: TopView) -> list[tuple[str, ...]]:
    """The cells of `dstack top`'s table, one row per host (without the headers)."""
    return [_cells(h) for h in view.hosts]


def _cells(host: HostTop) -> tuple[str, ...]:
    gpus = "-"
    if host.gpus_total is not None:
        used = "?" if host.gpus_used is None else str(host.gpus_used)
        gpus = f"{used}/{host.gpus_total}"
        names = sorted(set(host.gpu_names))
        if names:
            gpus += " " + ",".join(names)
    tasks = "-"
    if host.tasks is not None:
        tasks = str(host.tasks)
        if host.runs:
            tasks += f" ({', '.join(dict.fromkeys(host.runs))})"
    return (
        host.host or "-",
        host.fleet,
        gpus,
        _percent(host.memory_percent),
        _percent(host.cpu_percent),
        tasks,
    )


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def error_lines(view: TopView) -> list[str]:
    """What `dstack top` says under its table about each host that did not answer."""
    return [
        f"{h.host or 'fleet.' + h.fleet}: {h.error}" for h in view.hosts if h.error is not None
    ]
