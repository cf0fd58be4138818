"""The reconcile loop: each tick reads state, asks the agents, acts, and commits what changed.

Level-triggered: a tick decides from what is, not from what happened since the last one, so a
watch killed at any moment and started again simply carries on (jobs run on their agents, not
in this process). It never takes the apply lock: `apply` and `watch` run side by side, and
every write is a compare-and-swap commit of small mutations that yield to apply's (see
`record`). Watch never starts an agent (only apply does), and starts no job for a run the
state no longer has as the tick read it, nor while an operation holds the lock (`superseded`):
a destroy beside it wins. Only the holder of the leader lease acts; a standby still
observes (metrics), so it is warm when it takes over.

One tick, in order:
1. renew (or take) the lease (and tell `on_lead`: serving binds only while this watch leads);
2. refresh: every agent is asked for its jobs once (over the SSH connections the project keeps
   open across ticks);
3. ask every machine of the fleets in state and of the fleets runs use for its metrics (GPU
   utilisation, reachability, the jobs that make it busy);
4. act, as leader: each actor of `watch/actors.py` in turn (hosts lost, gangs, limits,
   retries, rolling updates, queued and scheduled runs, idle machines), each seeing what the
   ones before it changed;
5. commit the statuses and job records the refresh found, and what the actors changed;
6. report (`TickReport`): to metrics, events and the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from dstack_plan.config.gcpause import gc_paused
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.records import RunRecord
from dstack_plan.state.commit import commit_async
from dstack_plan.state.events import Event
from dstack_plan.state.model import ResourceState, State, timestamp
from dstack_plan.watch.actors import default_actors
from dstack_plan.watch.events import status_events
from dstack_plan.watch.model import HostSeen, JobSeen, TickReport
from dstack_plan.watch.record import Observed, record_observed
from dstack_plan.watch.tick import Actor, Tick

if TYPE_CHECKING:
    from dstack_plan.project import Project
    from dstack_plan.state.events import EventLog

log = logging.getLogger(__name__)

HOST_TIMEOUT = 10.0
"""Seconds a tick waits for one agent's metrics before counting the host unreachable."""
MAX_CONCURRENT_HOSTS = 32


class Lease(Protocol):
    """The leader lease (`state/lease.py`): True while this process may act."""

    def acquire_or_renew(self) -> bool: ...

    def release(self) -> None: ...


Reporter = Callable[[TickReport, list[tuple[str, str, str]]], None]
"""Called after each tick with its report and the (address, old, new) status changes."""


class Watcher:
    """Reconciles one project's state with its agents, tick after tick."""

    def __init__(
        self,
        project: Project,
        *,
        lease: Lease | None = None,
        events: EventLog | None = None,
        reporters: Sequence[Reporter] = (),
        actors: Sequence[Actor] | None = None,
        on_lead: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        self.project = project
        # Watch only talks to agents that run: a tick that read the state before a destroy
        # committed must not start again the agents destroy stopped (only apply puts agents on
        # hosts). A host without one does not answer this tick, as one cut off.
        project.machines.start_agents = False
        self.clock = project.clock
        self.lease = lease
        self.events = events
        """Where status changes go (the bounded log beside the state), when given."""
        self.reporters = list(reporters)
        self._last_jobs: dict[tuple[str, str], int] = {}
        """(fleet, host) -> the jobs its agent last counted (`_fleets`)."""
        self.actors = list(default_actors() if actors is None else actors)
        """The rules a leader carries out each tick, in order (`watch/actors.py`)."""
        self.on_lead = on_lead
        """Told each tick whether this watch leads, before the actors act (serving binds
        only while it does: `serving.ServeWhileLeading`)."""

    async def run(self, interval: float, once: bool = False) -> None:
        """Tick every `interval` seconds (measured from each tick's start) until cancelled;
        one tick with `once`. A tick that fails is logged and the next one tries again."""
        try:
            while True:
                started = self.clock.now()
                try:
                    await self.tick()
                except DstackPlanError as e:
                    log.error("tick failed: %s", e, extra={"event": "tick_failed"})
                    if once:
                        raise
                if once:
                    return
                await self.clock.sleep(max(0.0, started + interval - self.clock.now()))
        finally:
            if self.lease is not None:
                await asyncio.to_thread(self.lease.release)

    async def tick(self) -> TickReport:
        """One tick (see the module doc). Without the cyclic GC, as a plan: the objects a
        tick makes over 10,000 jobs made a full collection of the whole heap most ticks,
        a third of the tick's CPU, while reference counting frees them all at its end."""
        with gc_paused():
            return await self._tick()

    async def _tick(self) -> TickReport:
        started = self.clock.now()
        leader = (
            True if self.lease is None else await asyncio.to_thread(self.lease.acquire_or_renew)
        )
        if self.on_lead is not None:
            await self.on_lead(leader)
        snapshot = await asyncio.to_thread(self.project.backend.read)
        self.project.imports.forget()  # owners' exports and policies as they are now
        refresh = await self.project.refresh(snapshot)
        before = snapshot.state
        after = refresh.state
        hosts = await self._hosts(after)
        changes: list[tuple[str, str, str]] = []
        retries = 0
        if leader:
            acted: set[str] = set()
            events: list[Event] = []
            for actor in self.actors:
                tick = Tick(self.project, after, before, self.clock.now(), hosts)
                try:
                    result = await actor.act(tick)
                except DstackPlanError as e:
                    log.error("%s: %s", actor.name, e, extra={"event": "actor_failed"})
                    continue
                if result.changed:
                    after = after.model_copy(
                        update={"resources": {**after.resources, **result.changed}}
                    )
                    acted.update(result.changed)
                retries += result.resubmitted
                events += result.events
            changes = await self._commit(before, after, acted, events)
        report = TickReport(
            started_at=started,
            duration_s=self.clock.now() - started,
            leader=leader,
            runs={a: r.status for a, r in _runs(after).items()},
            jobs=tuple(_jobs(after)),
            hosts=tuple(hosts),
            fleets=self._fleets(after, hosts),
            queue_depth=sum(1 for r in _runs(after).values() if r.status == "pending"),
            retries=retries,
            bandwidth=_bandwidth(after),
        )
        for reporter in self.reporters:
            reporter(report, changes)
        return report

    async def _commit(
        self, before: State, after: State, acted: set[str], extra: list[Event]
    ) -> list[tuple[str, str, str]]:
        """Write the runs' refreshed statuses and whatever the actors changed; log events."""
        observed: dict[str, Observed] = {}
        changes = []
        for address, entry in after.resources.items():
            old = before.resources.get(address)
            if old is None or (entry.kind not in RUN_KINDS and address not in acted):
                continue
            if old.status == entry.status and old.attributes == entry.attributes:
                continue
            observed[address] = Observed(old.updated_at, entry.status, dict(entry.attributes))
            if old.status != entry.status:
                changes.append((address, old.status, entry.status))
        if observed:
            mutation = record_observed(observed, timestamp(self.clock))
            await commit_async(self.project.backend, mutation)
        if self.events is not None:
            found = status_events(before, after, self.clock.now()) if observed else []
            if found or extra:
                await asyncio.to_thread(self.events.append, [*found, *extra])
        return changes

    async def _hosts(self, state: State) -> list[HostSeen]:
        """Every machine of the fleets in state (their `dstack_instances` status needs its
        jobs, other projects' too) and of the fleets runs use (other projects' and `local`
        among them), asked for its metrics side by side."""
        used = {RunRecord.of(r).fleet for r in _runs(state).values()}
        machines = []
        for fleet in sorted(used | set(_host_fleets(state))):
            try:
                machines += await self.project.machines.machines(fleet, state)
            except DstackPlanError as e:
                log.warning(
                    "fleet %s: %s",
                    fleet,
                    e,
                    extra={
                        "event": "fleet_machines_failed",
                        "address": f"fleet.{fleet}",
                        "resource_type": "fleet",
                    },
                )
        limit = asyncio.Semaphore(MAX_CONCURRENT_HOSTS)

        async def one(fleet: str, host: str) -> HostSeen:
            async with limit:
                try:
                    agent = await self.project.machines.agent(fleet, host, state)
                    text = await asyncio.wait_for(agent.metrics(), HOST_TIMEOUT)
                except (DstackPlanError, asyncio.TimeoutError) as e:
                    why = str(e) or "no answer in time"
                    return HostSeen(fleet=fleet, host=host, reachable=False, error=why)
            from dstack_plan.fleets.host_status import jobs_in_metrics

            return HostSeen(
                fleet=fleet,
                host=host,
                reachable=True,
                metrics_text=text,
                jobs=jobs_in_metrics(text),
            )

        return list(await asyncio.gather(*(one(m.fleet, m.host) for m in machines)))

    def _fleets(self, state: State, hosts: Sequence[HostSeen]) -> dict[str, dict[str, int]]:
        """Fleet -> instance status -> how many of its hosts (`dstack_instances`), each by
        `host_status` from its record and the jobs its agent counted this tick. A host that
        missed this tick's check, but that watch does not count unreachable yet (fewer than
        three failed checks, `reachability.py`), keeps the jobs it last had."""
        from dstack_plan.fleets.host_status import UNREACHABLE, host_status
        from dstack_plan.fleets.records import FleetRecord

        seen = {(h.fleet, h.host): h for h in hosts}
        last: dict[tuple[str, str], int] = {}
        counts: dict[str, dict[str, int]] = {}
        for entry in state.resources.values():
            if entry.kind != "fleet":
                continue
            by_status = counts.setdefault(entry.name, {})
            for host in FleetRecord.of(entry).hosts:
                key = (entry.name, host.name)
                answer = seen.get(key)
                jobs = answer.jobs if answer is not None and answer.reachable else None
                if jobs is None and host.status != UNREACHABLE:
                    jobs = self._last_jobs.get(key)
                if jobs is not None:
                    last[key] = jobs
                status = host_status(host.status, jobs)
                by_status[status] = by_status.get(status, 0) + 1
        self._last_jobs = last
        return counts


def _runs(state: State) -> dict[str, ResourceState]:
    return {a: r for a, r in state.resources.items() if r.kind in RUN_KINDS}


def _jobs(state: State) -> list[JobSeen]:
    seen = []
    for address, run in _runs(state).items():
        for job in RunRecord.of(run).jobs:
            seen.append(JobSeen(address=address, job_id=job.id, host=job.host, status=job.status))
    return seen


def _bandwidth(state: State) -> tuple[tuple[str, str, str, float], ...]:
    from dstack_plan.fleets.records import FleetRecord

    links = []
    for entry in state.resources.values():
        record = FleetRecord.of(entry) if entry.kind == "fleet" else None
        if record is not None and record.bandwidth is not None:
            for (src, dst), rate in record.bandwidth.matrix().items():
                links.append((entry.name, src, dst, rate))
    return tuple(links)


def _host_fleets(state: State) -> list[str]:
    """The fleets of `state` whose machines are hosts with agents."""
    from dstack_plan.providers.names import HOST_FLEET_PROVIDERS

    return [
        e.name
        for e in state.resources.values()
        if e.kind == "fleet" and e.provider in HOST_FLEET_PROVIDERS
    ]
