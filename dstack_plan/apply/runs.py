"""Runs (tasks, services, dev environments): jobs submitted to the agents of their fleet."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from dstack_plan.agent.api_models import JobInfo, JobStatus
from dstack_plan.agent.client import AgentClient
from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.apply.jobs import JobContext, JobSlot, build_job, slots
from dstack_plan.config.runs import RunSpec, ServiceSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import AgentError, ProviderError
from dstack_plan.plan.model import ResourceChange
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.local import LOCAL_FLEET, LocalProvider
from dstack_plan.state.model import ResourceState

_ACTIVE = (JobStatus.RUNNING, JobStatus.PULLING)
MAX_CONCURRENT_STOPS = 16
STOP_WAIT_SLACK = 15.0
"""Seconds allowed beyond a job's stop timeout for the agent to report it finished."""


def run_status(jobs: list[JobInfo]) -> str:
    """A run's status from its jobs' (dstack's derivation, simplified for one host)."""
    statuses = {j.status for j in jobs}
    if not jobs:
        return "terminated"
    if statuses & set(_ACTIVE):
        return "running"
    if JobStatus.SUBMITTED in statuses:
        return "submitted"
    if JobStatus.TERMINATING in statuses:
        return "terminating"
    if JobStatus.FAILED in statuses:
        return "failed"
    if statuses == {JobStatus.DONE}:
        return "done"
    return "terminated"


class RunHandler(ResourceHandler):
    """Create, scale, refresh and stop runs on the built-in local fleet."""

    def __init__(self, local: LocalProvider, secrets: SecretStore, deployment: str):
        self.local = local
        self.secrets = secrets
        self.deployment = deployment

    async def agent_for(self, fleet: str, address: str) -> AgentClient:
        """The agent client of the fleet a run is on (only the local fleet has one so far)."""
        if fleet != LOCAL_FLEET:
            raise ProviderError(
                "fleet", f"fleet {fleet!r} has no provider in this version yet", address
            )
        return await self.local.agent()

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
        attributes: dict[str, Any] = {
            "fleet": fleet,
            "generation": generation,
            "deployment": self.deployment,
            "price_per_hour": change.placement.price_per_hour if change.placement else 0.0,
            "jobs": [],
        }
        jobs = await self._submit(agent, spec, change.name, slots(spec), generation, ctx)
        attributes["jobs"] = [_job_record(j, slot) for j, slot in jobs]
        return Outcome(status=run_status([j for j, _ in jobs]), attributes=attributes)

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        assert change.after is not None
        spec = spec_from_normalized(change.kind, change.after)
        assert isinstance(spec, RunSpec)
        attributes = dict(current.attributes)
        if not isinstance(spec, ServiceSpec):
            return Outcome(status=current.status, attributes=attributes)
        # scale a service: add missing replicas, stop the surplus
        agent = await self.agent_for(fleet_of(current), change.address)
        records = list(attributes.get("jobs", []))
        wanted = slots(spec)
        have = {(r["replica"], r["node"]) for r in records}
        missing = [s for s in wanted if (s.replica, s.node) not in have]
        surplus = [
            r
            for r in records
            if (r["replica"], r["node"]) not in {(s.replica, s.node) for s in wanted}
        ]
        generation = int(attributes.get("generation", 0))
        added = await self._submit(agent, spec, change.name, missing, generation, ctx)
        await self._stop_and_remove(agent, [r["id"] for r in surplus], spec)
        kept = [r for r in records if r not in surplus]
        attributes["jobs"] = kept + [_job_record(j, slot) for j, slot in added]
        infos = await _infos(agent, [r["id"] for r in attributes["jobs"]])
        return Outcome(status=run_status(list(infos.values())), attributes=attributes)

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        records = list(current.attributes.get("jobs", []))
        if not records:
            return Refreshed(current.status, dict(current.attributes))
        agent = await self.agent_for(fleet_of(current), current.address)
        return _refreshed(current, await _infos(agent, [r["id"] for r in records]))

    async def refresh_many(
        self, currents: Sequence[ResourceState], ctx: ApplyContext
    ) -> dict[str, Refreshed]:
        """One job listing per agent, shared by all the runs on it (not a request per job)."""
        listings: dict[str, dict[str, JobInfo]] = {}
        found: dict[str, Refreshed] = {}
        for current in currents:
            if not current.attributes.get("jobs"):
                found[current.address] = Refreshed(current.status, dict(current.attributes))
                continue
            fleet = fleet_of(current)
            jobs = listings.get(fleet)
            if jobs is None:
                agent = await self.agent_for(fleet, current.address)
                jobs = listings[fleet] = {j.id: j for j in await agent.list_jobs()}
            found[current.address] = _refreshed(current, jobs)
        return found

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        agent = await self.agent_for(fleet_of(current), current.address)
        spec = spec_from_normalized(current.kind, current.spec)
        assert isinstance(spec, RunSpec)
        listed = await agent.list_jobs(run_name=current.name)
        removed = _jobs_to_remove(current, listed, self.deployment, ctx.replacement)
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
            ctx.progress(f"{spec.type}.{run_name}", f"submitting job {job.id}")
            submitted.append((await agent.submit(job), slot))
        return submitted

    async def _stop_and_remove(self, agent: AgentClient, ids: list[str], spec: RunSpec) -> None:
        timeout = float(spec.stop_duration) if spec.stop_duration != "off" else 0.0

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


def fleet_of(run: ResourceState) -> str:
    """The fleet a run in state is on, as its create recorded it (`local` before fleets)."""
    return str(run.attributes.get("fleet", LOCAL_FLEET))


def _refreshed(current: ResourceState, known: Mapping[str, JobInfo]) -> Refreshed:
    """A run's refreshed status and job records, from the jobs its agent knows (by id)."""
    attributes = dict(current.attributes)
    records = list(attributes.get("jobs", []))
    infos = {r["id"]: known[r["id"]] for r in records if r["id"] in known}
    attributes["jobs"] = [
        {**r, "status": infos[r["id"]].status.value} if r["id"] in infos else r for r in records
    ]
    finished = current.status in ("done", "failed", "terminated", "aborted")
    if not infos:
        if finished:
            return Refreshed(current.status, attributes)
        return Refreshed(current.status, attributes, gone="jobs are gone from the agent")
    return Refreshed(run_status(list(infos.values())), attributes)


def _jobs_to_remove(
    current: ResourceState,
    listed: Sequence[JobInfo],
    deployment: str,
    replacement: ResourceState | None,
) -> set[str]:
    """The jobs a delete of run `current` removes: those it recorded, and those a create cut
    short submitted without recording them, found among the agent's `listed` jobs of the run
    by their labels (this deployment; `current`'s generation when it is known).

    Never the jobs of `replacement`, the object that replaced `current` at its address
    (create-before-destroy): the run's jobs share its name, and the new ones must live on.
    """
    spared = _job_ids(replacement) if replacement is not None else set()
    spared_generation = _generation(replacement) if replacement is not None else None
    generation = _generation(current)
    ids = _job_ids(current)
    for job in listed:
        labels = job.spec.get("labels", {}) if isinstance(job.spec, dict) else {}
        if labels.get("deployment") != deployment:
            continue
        label = labels.get("generation")  # None: submitted before jobs carried it
        if label is not None and (
            label == spared_generation or (generation is not None and label != generation)
        ):
            continue
        ids.add(job.id)
    return ids - spared


def _generation(run: ResourceState) -> str | None:
    value = run.attributes.get("generation")
    return None if value is None else str(value)


def _job_ids(run: ResourceState) -> set[str]:
    records = run.attributes.get("jobs", [])
    return {str(r["id"]) for r in records if isinstance(r, dict) and "id" in r}


def _job_record(job: JobInfo, slot: JobSlot) -> dict[str, Any]:
    return {
        "id": job.id,
        "host": "localhost",
        "replica": slot.replica,
        "node": slot.node,
        "status": job.status.value,
        "runtime": job.runtime,
    }


async def _infos(agent: AgentClient, ids: list[str]) -> dict[str, JobInfo]:
    found: dict[str, JobInfo] = {}
    for job_id in ids:
        try:
            found[job_id] = await agent.get_job(job_id)
        except AgentError as e:
            if e.status != 404:
                raise
    return found
