"""Runs (tasks, services, dev environments): jobs submitted to the agents of their fleet."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from dstack_plan.agent.api_models import JobInfo, JobStatus
from dstack_plan.agent.client import AgentClient
from dstack_plan.apply.deployment import Deployment
from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.apply.job_ownership import jobs_to_remove
from dstack_plan.apply.jobs import JobContext, JobSlot, build_job, run_kind, slots
from dstack_plan.apply.run_health import crash, run_status
from dstack_plan.apply.run_records import JobRecord, RunRecord
from dstack_plan.config.runs import RunSpec, ServiceSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import AgentError, ProviderError
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.plan.model import ResourceChange
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.base import FleetProviders
from dstack_plan.providers.local import LOCAL_FLEET, LOCAL_PROVIDER
from dstack_plan.state.model import ResourceState

MAX_CONCURRENT_STOPS = 16
STOP_WAIT_SLACK = 15.0
"""Seconds allowed beyond a job's stop timeout for the agent to report it finished."""
PORTS_WAIT = 10.0
"""Seconds apply waits for a started container to say which host ports Docker gave it."""


class RunHandler(ResourceHandler):
    """Create, scale, refresh and stop runs on the agents of their fleet's machines.

    Only machines a provider has without being asked (`Provider.implicit_instances`: the
    built-in local fleet) are reached so far.
    """

    def __init__(
        self, providers: FleetProviders, secrets: SecretStore, deployment: str | Deployment
    ) -> None:
        self.providers = providers
        self.secrets = secrets
        self._deployment = deployment

    @property
    def deployment(self) -> str:
        """The key of the state this handler's jobs belong to (see `apply.deployment`)."""
        return str(self._deployment)

    def cannot_create(self, kind: str, provider: str) -> str | None:
        if provider == LOCAL_PROVIDER:
            return None
        # agent_for reaches only the local fleet's agent so far
        return f"the {provider} provider cannot run {kind}s in this version (only the local fleet)"

    async def agent_for(self, fleet: str, address: str) -> AgentClient:
        """The agent client of the fleet a run is on (see `fleet_agent`)."""
        return await fleet_agent(self.providers, fleet, address)

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        assert change.after is not None
        spec = spec_from_normalized(change.kind, change.after)
        assert isinstance(spec, RunSpec)
        fleet = change.placement.fleet if change.placement else LOCAL_FLEET
        if change.placement is not None and change.placement.placed is False:
            # the agent would start it anyway (process jobs have no limits): refuse instead
            raise ProviderError(fleet, change.placement.note or "cannot be placed")
        agent = await self.agent_for(fleet, change.address)
        generation = int(ctx.clock.now() * 1000)
        jobs = await self._submit(agent, spec, change.name, slots(spec), generation, ctx)
        record = RunRecord(
            fleet=fleet,
            generation=generation,
            deployment=self.deployment,
            price_per_hour=change.placement.price_per_hour if change.placement else 0.0,
            jobs=tuple(JobRecord.of_job(j, slot.replica, slot.node) for j, slot in jobs),
        )
        return Outcome(status=run_status([j for j, _ in jobs]), attributes=record.to_json())

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        assert change.after is not None
        spec = spec_from_normalized(change.kind, change.after)
        assert isinstance(spec, RunSpec)
        if not isinstance(spec, ServiceSpec):
            return Outcome(status=current.status, attributes=dict(current.attributes))
        # scale a service: add missing replicas, stop the surplus
        record = RunRecord.of(current)
        agent = await self.agent_for(record.fleet, change.address)
        wanted = {(s.replica, s.node) for s in slots(spec)}
        have = {r.slot for r in record.jobs}
        missing = [s for s in slots(spec) if (s.replica, s.node) not in have]
        kept = [r for r in record.jobs if r.slot in wanted]
        surplus = [r.id for r in record.jobs if r.slot not in wanted]
        generation = record.generation or 0
        added = await self._submit(agent, spec, change.name, missing, generation, ctx)
        await self._stop_and_remove(agent, surplus, spec)
        jobs = kept + [JobRecord.of_job(j, slot.replica, slot.node) for j, slot in added]
        infos = await _infos(agent, [r.id for r in jobs])
        attributes = {**current.attributes, "jobs": [j.to_json() for j in jobs]}
        return Outcome(status=run_status(list(infos.values())), attributes=attributes)

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        record = RunRecord.of(current)
        if not record.jobs:
            return Refreshed(current.status, dict(current.attributes))
        agent = await self.agent_for(record.fleet, current.address)
        return _refreshed(current, record, await _infos(agent, record.job_ids()))

    async def refresh_many(
        self, currents: Sequence[ResourceState], ctx: ApplyContext
    ) -> dict[str, Refreshed]:
        """One job listing per agent, shared by all the runs on it (not a request per job)."""
        listings: dict[str, dict[str, JobInfo]] = {}
        found: dict[str, Refreshed] = {}
        for current in currents:
            record = RunRecord.of(current)
            if not record.jobs:
                found[current.address] = Refreshed(current.status, dict(current.attributes))
                continue
            jobs = listings.get(record.fleet)
            if jobs is None:
                agent = await self.agent_for(record.fleet, current.address)
                jobs = listings[record.fleet] = {j.id: j for j in await agent.list_jobs()}
            found[current.address] = _refreshed(current, record, jobs)
        return found

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        agent = await self.agent_for(fleet_of(current), current.address)
        spec = spec_from_normalized(current.kind, current.spec)
        assert isinstance(spec, RunSpec)
        listed = await agent.list_jobs(run_name=current.name)
        removed = jobs_to_remove(current, listed, self.deployment, ctx.replacement)
        await self._stop_and_remove(agent, sorted(removed), spec)

    async def _submit(
        self,
        agent: AgentClient,
        spec: RunSpec,
        run_name: str,
        wanted: list[JobSlot],
        generation: int,
        ctx: ApplyContext,
    ) -> list[tuple[JobInfo, JobSlot]]:
        nodes = max((s.node for s in slots(spec)), default=0) + 1
        context = JobContext(
            run_name=run_name,
            run_id=f"{self.deployment}/{run_name}",
            generation=generation,
            deployment=self.deployment,
            nodes_num=nodes,
            master_ip="127.0.0.1",
            node_ips=tuple("127.0.0.1" for _ in range(nodes)),
        )
        submitted = []
        for slot in wanted:
            job = build_job(spec, slot, context, self.secrets, ctx.run_args)
            ctx.progress(f"{run_kind(spec)}.{run_name}", f"submitting job {job.id}")
            submitted.append((await agent.submit(job), slot))
        return await _with_host_ports(agent, submitted, ctx)

    async def _stop_and_remove(self, agent: AgentClient, ids: list[str], spec: RunSpec) -> None:
        timeout = stop_seconds(spec)
        limit = asyncio.Semaphore(MAX_CONCURRENT_STOPS)

        async def one(job_id: str) -> None:
            async with limit:
                try:
                    info = await agent.get_job(job_id)
                    if not info.finished:
                        await agent.stop(job_id, timeout=timeout)
                        await agent.wait(job_id, timeout=timeout + STOP_WAIT_SLACK)
                    await agent.delete(job_id, force=True)
                except AgentError as e:
                    if e.status != 404:
                        raise

        # all jobs stop in parallel (each may wait out its graceful window), at most N at once
        await asyncio.gather(*(one(i) for i in ids))


async def fleet_agent(providers: FleetProviders, fleet: str, address: str) -> AgentClient:
    """The agent client of the machine `fleet`'s provider has for it without being asked
    (only the local fleet has one so far), for the run at `address`."""
    provider = providers(fleet)
    if provider is None:
        raise ProviderError(
            "fleet", f"fleet {fleet!r} has no provider in this version yet", address
        )
    machines = provider.implicit_instances(fleet)
    if not machines:
        raise ProviderError(
            provider.name, f"fleet {fleet!r} has no machine runs can reach yet", address
        )
    return await provider.agent(machines[0])


def stop_seconds(spec: RunSpec) -> float:
    """Seconds between SIGTERM and SIGKILL: the run's `stop_duration` (0 when off)."""
    duration = spec.stop_duration
    return 0.0 if duration == "off" or duration is None else float(duration)


def fleet_of(run: ResourceState) -> str:
    """The fleet a run in state is on, as its create recorded it (`local` before fleets)."""
    return RunRecord.of(run).fleet


def _refreshed(
    current: ResourceState, record: RunRecord, known: Mapping[str, JobInfo]
) -> Refreshed:
    """A run's refreshed status and job records, from the jobs its agent knows (by id)."""
    found = [(r, known[r.id]) for r in record.jobs if r.id in known]
    if not found:
        attributes = dict(current.attributes)
        if current.status in FINISHED_STATUSES:
            return Refreshed(current.status, attributes)
        return Refreshed(current.status, attributes, gone="jobs are gone from the agent")
    infos = {r.id: info for r, info in found}
    jobs = [r.refreshed(infos[r.id]) if r.id in infos else r for r in record.jobs]
    attributes = {**current.attributes, "jobs": [j.to_json() for j in jobs]}
    status = run_status([info for _, info in found])
    return Refreshed(status, attributes, crashed=crash(current.kind, current.name, found))


async def _with_host_ports(
    agent: AgentClient, jobs: list[tuple[JobInfo, JobSlot]], ctx: ApplyContext
) -> list[tuple[JobInfo, JobSlot]]:
    """The jobs as their agent knows them once it has said where their ports listen.

    Docker chooses a bridged container's host ports when it starts it, a moment after the
    submit: wait that moment (never through an image pull, at most PORTS_WAIT seconds), so
    state records where each replica listens."""
    deadline = ctx.clock.now() + PORTS_WAIT
    out = []
    for info, slot in jobs:
        while _ports_unknown(info) and ctx.clock.now() < deadline:
            await ctx.clock.sleep(0.1)
            try:
                info = await agent.get_job(info.id)
            except AgentError as e:
                if e.status != 404:
                    raise
                break
        out.append((info, slot))
    return out


def _ports_unknown(info: JobInfo) -> bool:
    declared = info.spec.get("ports") if isinstance(info.spec, dict) else None
    if not declared:
        return False
    if info.status in (JobStatus.PULLING,) or info.finished:
        return False
    return info.status is JobStatus.SUBMITTED or any(p.host_port is None for p in info.ports)


async def _infos(agent: AgentClient, ids: list[str]) -> dict[str, JobInfo]:
    found: dict[str, JobInfo] = {}
    for job_id in ids:
        try:
            found[job_id] = await agent.get_job(job_id)
        except AgentError as e:
            if e.status != 404:
                raise
    return found
