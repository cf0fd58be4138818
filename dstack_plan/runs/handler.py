"""Runs (tasks, services, dev environments): jobs submitted to the agents of their fleet."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.agent.client import AgentClient
from dstack_plan.agent.jobs_api import JobsAPI
from dstack_plan.agent.protocol import SCALED_DOWN
from dstack_plan.apply.deployment import Deployment
from dstack_plan.apply.events import plural
from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.quotas import namespace_of
from dstack_plan.config.runs import RunSpec, ServiceSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import AgentError, DstackPlanError, PlanError, ProviderError
from dstack_plan.fleets.load import fleet_load
from dstack_plan.fleets.machines import FleetMachines, Machine
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.plan.model import Action, MachineOffer, ResourceChange
from dstack_plan.plan.normalize import CODE_KEY, spec_from_normalized
from dstack_plan.providers.local import LOCAL_FLEET, LOCAL_PROVIDER
from dstack_plan.providers.names import ENGINES, HOST_FLEET_PROVIDERS
from dstack_plan.runs.admission import admit
from dstack_plan.runs.attempts import attempts_of, kept_job_ids
from dstack_plan.runs.code_archive import CodeArchive, PrivatePaths, pack
from dstack_plan.runs.health import crash, run_status
from dstack_plan.runs.jobs import JobContext, JobSlot, job_id, slots, stop_seconds
from dstack_plan.runs.ownership import jobs_to_remove
from dstack_plan.runs.placing import HostRun, place_on_fleet
from dstack_plan.runs.queueing import (
    QUEUED_KEY,
    SCHEDULE_KEY,
    STOPPED_BY_USER,
    NoCapacity,
    Queued,
    Scheduled,
    next_fire,
    pending_attributes,
    scheduled,
    waiting_for,
    waits_for_capacity,
)
from dstack_plan.runs.records import JobRecord, RunRecord, retry_due_at
from dstack_plan.runs.rollout import job_spec_hash, roll, rolls, stamped
from dstack_plan.runs.scaling import kept_replicas, scaled_to_zero
from dstack_plan.runs.share_gate import check_share
from dstack_plan.runs.submission import PlacedJob, RunSubmission, Submitted, submit_jobs
from dstack_plan.runs.usage import slot_gpus
from dstack_plan.runs.user import current_user
from dstack_plan.runs.volume_attach import VolumeAttacher
from dstack_plan.runs.volume_mounts import run_volume_names, volume_sites
from dstack_plan.state.model import ResourceState, State

MAX_CONCURRENT_STOPS = 16
MAX_CONCURRENT_LISTINGS = 32
STOP_WAIT_SLACK = 15.0
"""Seconds allowed beyond a job's stop timeout for the agent to report it finished."""
FleetGrower = Callable[[str, MachineOffer, RunSpec, ApplyContext], Awaitable[State]]
"""(cloud fleet, the offer planned, the run, ctx) -> the state with the fleet grown."""
RUN_PROVIDERS = frozenset({LOCAL_PROVIDER, *HOST_FLEET_PROVIDERS, *ENGINES})
"""The providers whose fleets runs can go to in this version."""


class RunHandler(ResourceHandler):
    """Create, scale, refresh and stop runs on the agents of their fleet's machines: the
    local fleet (this machine), SSH fleets and cloud fleets (the hosts their state entry
    records)."""

    def __init__(
        self,
        machines: FleetMachines,
        secrets: SecretStore,
        deployment: str | Deployment,
        code_dir: Callable[[str], Path] = lambda address: Path.cwd(),
        grow: FleetGrower | None = None,
        volumes: VolumeAttacher | None = None,
        private: Callable[[], PrivatePaths] = PrivatePaths,
    ) -> None:
        self.machines = machines
        self._private = private
        """What runs never send (the project's `.dstack/`, its state: `code_sources`)."""
        self._grow = grow
        """Adds machines to a cloud fleet a run bursts to (`runs/bursting.py`)."""
        self._volumes = volumes
        """Attaches the network volumes runs mount (`runs/volume_attach.py`)."""
        self.secrets = secrets
        self._deployment = deployment
        self.code_dir = code_dir
        """address -> the directory a run's relative `files:` and `repos:` paths start at
        (its config file's)."""

    @property
    def deployment(self) -> str:
        """The key of the state this handler's jobs belong to (see `apply.deployment`)."""
        return str(self._deployment)

    def cannot_create(self, kind: str, provider: str) -> str | None:
        if provider in RUN_PROVIDERS:
            return None
        return (
            f"the {provider} provider cannot run {kind}s in this version (only the local "
            "fleet, SSH fleets and cloud fleets)"
        )

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        """Start the run; or record it `pending` without jobs: a scheduled task (watch starts
        it when its cron fires), or a run no host has room for now whose `retry` covers
        no-capacity (watch places it when room frees; see `runs/queueing.py`)."""
        assert change.after is not None
        spec = spec_from_normalized(change.kind, change.after)
        assert isinstance(spec, RunSpec)
        fleet = change.placement.fleet if change.placement else LOCAL_FLEET
        now = ctx.clock.now()
        if scheduled(spec):
            record = Scheduled(next_run_at=next_fire(spec, now))
            owner = _owner(change, ctx.current_state())  # who it counts against, started
            attributes = pending_attributes(fleet, {**owner, SCHEDULE_KEY: record.to_json()})
            return Outcome(status="pending", attributes=attributes)
        try:
            return await self.start(change, ctx)
        except NoCapacity as e:
            if not waits_for_capacity(spec):
                raise
            queued = Queued(since=now, why=e.detail)
            ctx.progress(change.address, f"queued until a host has room: {e.detail}")
            owner = _owner(change, ctx.current_state())
            return Outcome(
                status="pending",
                attributes=pending_attributes(fleet, {**owner, QUEUED_KEY: queued.to_json()}),
            )

    async def start(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        """Place the run's jobs and submit them (what `create` does for a run it starts, and
        watch for a queued or scheduled one); `NoCapacity` when no host has room now."""
        assert change.after is not None
        spec = spec_from_normalized(change.kind, change.after)
        assert isinstance(spec, RunSpec)
        fleet = change.placement.fleet if change.placement else LOCAL_FLEET
        if change.placement is not None and change.placement.placed is False:
            # the agent would start it anyway (process jobs have no limits): refuse instead.
            # One that may wait is queued, not placed now: the runs the plan placed before
            # it may not have been submitted yet
            if change.placement.pending and waits_for_capacity(spec):
                raise NoCapacity(fleet, waiting_for(change.placement), change.address)
            raise ProviderError(fleet, change.placement.note or "cannot be placed")
        state = ctx.current_state()
        if self.machines.is_engine(fleet, state):  # Slurm, Kubernetes: theirs places the jobs
            return await self._start_on_engine(change, spec, fleet, state, ctx)
        burst = change.placement.offer if change.placement is not None else None
        if burst is not None:  # the plan sent it to new machines of a cloud fleet
            if self._grow is None:
                raise ProviderError(fleet, "this apply cannot add machines to fleets")
            ctx.progress(change.address, f"bursting to {fleet}: {plural(burst.count, 'machine')}")
            state = await self._grow(fleet, burst, spec, ctx)
        if self.machines.imports is not None:  # borrowing another project's fleet: fair share
            gpus_asked = sum(slot_gpus(spec).values())
            now = ctx.clock.now()
            check_share(self.machines.imports, fleet, change.address, gpus_asked, state, now)
        machines = await self._placed(change, spec, fleet, state)
        generation = int(ctx.clock.now() * 1000)
        run = RunSubmission(
            spec,
            change.name,
            self.deployment,
            generation,
            self.secrets,
            self.pack_code(change, spec),
        )

        jobs = await self.admit_jobs(change.address, run, slots(spec), fleet, machines, state, ctx)
        # new machines of a burst are the fleet's: its entry counts their price
        price = change.placement.price_per_hour if change.placement and not burst else 0.0
        return self._started(change, spec, fleet, generation, jobs, state, price)

    async def _start_on_engine(
        self, change: ResourceChange, spec: RunSpec, fleet: str, state: State, ctx: ApplyContext
    ) -> Outcome:
        """Submit the run to the cluster of engine fleet `fleet` (`runs/engine_runs.py`)."""
        generation = int(ctx.clock.now() * 1000)
        jobs = await self._submit_on_engine(change, spec, fleet, generation, state, ctx)
        return self._started(change, spec, fleet, generation, jobs, state, 0.0)

    async def _submit_on_engine(
        self,
        change: ResourceChange,
        spec: RunSpec,
        fleet: str,
        generation: int,
        state: State,
        ctx: ApplyContext,
        only: Sequence[JobSlot] | None = None,
    ) -> list[Submitted]:
        """Submit the run's jobs (`only` those slots: a service's new replicas) to the
        cluster of engine fleet `fleet`; the command's listing of it told."""
        from dstack_plan.runs.engine_runs import submit_run

        nodes = max(s.node for s in slots(spec)) + 1
        context = JobContext(
            run_name=change.name,
            run_id=f"{self.deployment}/{change.name}",
            generation=generation,
            deployment=self.deployment,
            nodes_num=nodes,
            master_ip="",  # each node learns the addresses from the engine
            node_ips=("",) * nodes,
        )
        jobs = await submit_run(
            self.machines, fleet, state, spec, context, self.secrets, ctx, change.address, only
        )
        for host in {j.machine.host for j in jobs}:
            key = self.machines.machine_key(fleet, host)
            self.machines.listings.record(key, [j.info for j in jobs if j.machine.host == host])
        return jobs

    def _started(
        self,
        change: ResourceChange,
        spec: RunSpec,
        fleet: str,
        generation: int,
        jobs: Sequence[Submitted],
        state: State,
        price: float,
    ) -> Outcome:
        """The outcome of a run whose `jobs` were just submitted."""
        gpus = slot_gpus(spec)
        assert change.after is not None
        record = RunRecord(
            fleet=fleet,
            generation=generation,
            deployment=self.deployment,
            price_per_hour=price,
            jobs=tuple(_job_record(j, gpus) for j in jobs),
            # what quotas count it against (`runs/usage.py`)
            namespace=namespace_of(change.after),
            user=_applier(change, state),
        )
        return Outcome(status=run_status([j.info for j in jobs]), attributes=record.to_json())

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        assert change.after is not None
        spec = spec_from_normalized(change.kind, change.after)
        assert isinstance(spec, RunSpec)
        if not isinstance(spec, ServiceSpec):
            return Outcome(status=current.status, attributes=dict(current.attributes))
        # scale a service: add missing replicas, stop the surplus; then, when what the
        # replicas run changed, replace them one at a time (`runs/rollout.py`)
        rolling = rolls(change)
        if rolling:
            current = stamped(current)  # the jobs it has run the spec it had
        runs = job_spec_hash(change.after) if rolling else None
        count = kept_replicas(spec, current.attributes)
        attributes = await self._resize(change, current, spec, count, ctx, spec_hash=runs)
        if rolling:
            entry = current.updated(now=current.updated_at, attributes=attributes)
            status, attributes = await roll(self, entry, change, ctx)
            return Outcome(status=status, attributes=attributes)
        return await self._outcome(current, attributes, ctx, scaled_to_zero=count == 0)

    async def scale(self, current: ResourceState, replicas: int, ctx: ApplyContext) -> Outcome:
        """Give service `current` exactly `replicas` replicas, on the spec it runs (watch's
        autoscaler): new ones placed and started, the surplus stopped (`scaled_down`)."""
        spec = spec_from_normalized(current.kind, dict(current.spec))
        assert isinstance(spec, ServiceSpec)
        change = ResourceChange.in_place(current)
        attributes = await self._resize(change, current, spec, replicas, ctx)
        return await self._outcome(current, attributes, ctx, scaled_to_zero=replicas == 0)

    async def _resize(
        self,
        change: ResourceChange,
        current: ResourceState,
        spec: ServiceSpec,
        count: int,
        ctx: ApplyContext,
        spec_hash: str | None = None,
    ) -> dict[str, Any]:
        """Replicas 0..`count`-1 of `spec`: the missing started, the others stopped; the
        attributes with the jobs that remain. `spec_hash` stamps the new jobs (a rollout)."""
        state = ctx.current_state()
        record = RunRecord.of(current)
        wanted = slots(spec, replicas=count)
        have = {r.slot for r in record.jobs}
        missing = [s for s in wanted if (s.replica, s.node) not in have]
        kept = [r for r in record.jobs if r.slot in {(s.replica, s.node) for s in wanted}]
        surplus = [r for r in record.jobs if r not in kept]
        added: list[Submitted] = []
        if missing and self.machines.is_engine(record.fleet, state):
            generation = _unused_generation(
                record.generation or 0, change.name, self.deployment, missing, current, ctx
            )
            added = await self._submit_on_engine(
                change, spec, record.fleet, generation, state, ctx, missing
            )
        elif missing:
            replicas = len(missing)
            machines = await self.place_now(
                record.fleet, change.address, spec, state, replicas=replicas
            )
            generation = _unused_generation(
                record.generation or 0, change.name, self.deployment, missing, current, ctx
            )
            code = self.pack_code(change, spec)
            run = RunSubmission(spec, change.name, self.deployment, generation, self.secrets, code)
            added = await self.admit_jobs(
                change.address, run, missing, record.fleet, machines, state, ctx, replicas
            )
        await self._stop_and_remove(record.fleet, surplus, spec, state, reason=SCALED_DOWN)
        gpus = slot_gpus(spec)
        jobs = kept + [_job_record(j, gpus)._replace(spec_hash=spec_hash) for j in added]
        return {**current.attributes, "jobs": [j.to_json() for j in jobs]}

    async def _outcome(
        self,
        current: ResourceState,
        attributes: dict[str, Any],
        ctx: ApplyContext,
        scaled_to_zero: bool = False,
    ) -> Outcome:
        """The status of run `current` with `attributes` (its jobs) as they are now; a
        service scaled to zero by its request rate is running: it starts on a request."""
        record = RunRecord.of(current.model_copy(update={"attributes": attributes}))
        if scaled_to_zero and not record.jobs:
            return Outcome(status="running", attributes=attributes)
        infos = await self._infos(record.fleet, list(record.jobs), ctx.current_state())
        return Outcome(status=run_status(list(infos.values())), attributes=attributes)

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        return (await self.refresh_many([current], ctx))[current.address]

    async def refresh_many(
        self, currents: Sequence[ResourceState], ctx: ApplyContext
    ) -> dict[str, Refreshed]:
        """One job listing per machine, shared by all the runs on it (not a request per job).

        A run with a job on an SSH host that does not answer keeps its recorded status (its
        jobs may well run on): nothing is concluded from a host that cannot be asked."""
        state = ctx.current_state()
        wanted = _machines_of(currents)
        limit = asyncio.Semaphore(MAX_CONCURRENT_LISTINGS)

        async def ask(key: tuple[str, str]) -> dict[str, JobInfo] | None:
            async with limit:
                return await self._listing(key[0], wanted[key], state)

        keys = sorted(wanted)
        answers = await asyncio.gather(*(ask(k) for k in keys))
        listings: dict[tuple[str, str], dict[str, JobInfo] | None] = dict(
            zip(keys, answers, strict=True)
        )
        found: dict[str, Refreshed] = {}
        for current in currents:
            record = RunRecord.of(current)
            asked = {
                host: listings[(record.fleet, _machine_key(record.fleet, host))]
                for host in sorted(_hosts(record))
            }
            unreachable = None in asked.values()
            known = _listed(record, asked)
            if not record.jobs or unreachable:
                found[current.address] = Refreshed(current.status, dict(current.attributes))
            else:
                found[current.address] = _refreshed(current, record, known)
        return found

    async def start_listings(self, currents: Sequence[ResourceState], state: State) -> None:
        """Send the job listing requests `refresh_many(currents)` will make, as many as it
        makes at once, without waiting for the answers (`JobListings.start`): a plan sends
        them before it parses the files, and the agents answer meanwhile. No-op outside a
        command's kept listings; a machine that cannot be asked is left to the refresh,
        which says so."""
        if not self.machines.listings.active:
            return
        wanted = _machines_of(currents)
        for fleet, machine in sorted(wanted)[:MAX_CONCURRENT_LISTINGS]:
            host = wanted[(fleet, machine)]
            try:
                if not self.machines.has_host(fleet, host, state):
                    continue
                agent = await self.machines.jobs_api(fleet, host, state)
            except DstackPlanError:
                continue
            self.machines.start_jobs(fleet, host, agent)

    async def delete(
        self, current: ResourceState, ctx: ApplyContext, *, keep_recorded: bool = False
    ) -> None:
        """Stop and remove every job of the run on its agents: its current jobs, those of its
        earlier attempts (`runs/attempts.py`), and any its create submitted unrecorded.

        With `keep_recorded` (watch resubmitting the run: `watch/restart.py`), the jobs the
        entry records, current or of an earlier attempt, are stopped but stay on their agents
        with their logs (an ended attempt); only unrecorded ones are removed."""
        spec = spec_from_normalized(current.kind, current.spec)
        assert isinstance(spec, RunSpec)
        state = ctx.current_state()
        record = RunRecord.of(current)
        recorded = _hosts(record)
        earlier = attempts_of(current.attributes)
        kept: set[str] = set()
        if keep_recorded:
            kept = set(record.job_ids()) | kept_job_ids(current.attributes)
        # a create cut short may have submitted to hosts it did not record: look on all the
        # fleet's; a recorded host that left the fleet took its jobs with it (drained). The
        # hosts of earlier attempts are looked on too, but one that does not answer does not
        # fail the delete (their jobs ended: a lost host's job is stopped when it is back)
        known = await self._fleet_hosts(record.fleet, state)
        hosts = (recorded | {j.host for a in earlier for j in a.jobs}) if known is None else known
        if record.fleet == LOCAL_FLEET:
            hosts = {next(iter(sorted(hosts)), "localhost")}  # one machine, one agent
        for host in sorted(hosts):
            agent = await self.machines.jobs_api(record.fleet, host, state)
            try:  # the command's listing of the host, not one per run (`fleets/listings.py`)
                listed = await self.machines.jobs(record.fleet, host, state, current.name, agent)
            except DstackPlanError:
                if host in recorded or record.fleet == LOCAL_FLEET:
                    raise  # it holds jobs of this run: they must not be forgotten
                continue
            owned = jobs_to_remove(current, listed, self.deployment, ctx.replacement)
            here = {j.id for j in listed}
            jobs = [*record.jobs, *(j for a in earlier for j in a.jobs)]
            if record.fleet == LOCAL_FLEET:
                here |= {r.id for r in jobs}
            else:
                here |= {r.id for r in jobs if r.host == host}
            ids = sorted(owned & here)
            if ids:
                await self._stopped(record.fleet, host, agent, ids, spec, keep=kept)
        if self._volumes is not None and run_volume_names(spec):
            # its jobs are gone: the volumes they mounted leave their machines
            await self._volumes.release(state, excluding={current.address})

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
    ) -> list[Submitted]:
        """Submit `run`'s `job_slots` to `machines` of `fleet` (one each). Another project
        may take the GPUs or host ports the placement saw free: on such a loss at an agent,
        this attempt's jobs are withdrawn and placed again (`replicas` more of a service's,
        for a scale-up or a rollout's new replica), then submitted again (`runs/admission.py`).
        """

        async def submit(placed: Sequence[PlacedJob]) -> list[Submitted]:
            agents = await self._agents(fleet, {j.machine.host for j in placed}, state)
            return await self._submit(address, run, placed, agents, state, ctx)

        return await admit(
            run,
            job_slots,
            machines,
            place=lambda: self.place_now(fleet, address, run.spec, state, replicas),
            submit=submit,
            agent_of=lambda host: self.machines.agent(fleet, host, state),
            progress=lambda message: ctx.progress(address, message),
            sleep=ctx.clock.sleep,
        )

    # -- helpers -----------------------------------------------------------------------------

    async def _submit(
        self,
        address: str,
        run: RunSubmission,
        placed: Sequence[PlacedJob],
        agents: dict[str, AgentClient],
        state: State,
        ctx: ApplyContext,
    ) -> list[Submitted]:
        """Attach the network volumes the placed jobs mount to their machines, then submit."""
        if run_volume_names(run.spec):
            if self._volumes is None:
                raise ProviderError("volume", "this apply cannot attach volumes", address)
            disks = await self._volumes.attach(
                run.spec, placed, state, lambda m: ctx.progress(address, m)
            )
            run = run._replace(disks=disks)
        try:
            submitted = await submit_jobs(run, placed, agents, ctx)
        except BaseException:
            # some may have been submitted (or refused: others took the room): ask again
            for fleet in {j.machine.fleet for j in placed}:
                self.machines.listings.relist(fleet)
            raise
        for job in submitted:  # the command's listing shows them (`fleets/listings.py`)
            self.machines.listings.record(
                self.machines.machine_key(job.machine.fleet, job.machine.host), [job.info]
            )
        return submitted

    def pack_code(self, change: ResourceChange, spec: RunSpec) -> CodeArchive | None:
        """The run's local files, packed now; refused when they are not what the plan saw
        (a saved plan applied after an edit would run other code than it showed)."""
        archive = pack(
            spec, self.code_dir(change.address), run=change.address, private=self._private()
        )
        planned = change.after.get(CODE_KEY) if change.after else None
        found = archive.fingerprint() if archive else None
        if planned is not None and found != planned:
            raise PlanError(
                f"{change.address}: its local files changed since the plan was made "
                "(files: / repos:); run plan again"
            )
        return archive

    async def _placed(
        self, change: ResourceChange, spec: RunSpec, fleet: str, state: State
    ) -> list[Machine]:
        """The machine of each job: where the plan placed it, or, when the plan could not
        know the machines (the fleet is created by this apply), placed now by the same rules.
        Another project's fleet takes new jobs only while it is exported to this project."""
        self.machines.check_placeable(fleet)
        planned = change.placement.hosts if change.placement else ()
        if planned and len(planned) == len(slots(spec)):
            by_host = {m.host: m for m in await self.machines.machines(fleet, state)}
            if all(h in by_host for h in planned):
                return [by_host[h] for h in planned]
        return await self.place_now(fleet, change.address, spec, state)

    async def place_now(
        self,
        fleet: str,
        address: str,
        spec: RunSpec,
        state: State,
        replicas: int | None = None,
    ) -> list[Machine]:
        """Place the run's jobs (or `replicas` more of a service's) on the fleet's usable
        machines as they are loaded now; raise ProviderError when they do not fit.

        Within a command the machines' listings are those it made before, kept up to date
        with its own submissions (`fleets/listings.py`): a run they leave no room for is
        placed once more from listings asked now (others' jobs may have ended meanwhile)."""
        try:
            return await self._place_now(fleet, address, spec, state, replicas)
        except NoCapacity:
            if not self.machines.listings.active:
                raise
        self.machines.listings.relist(fleet)
        return await self._place_now(fleet, address, spec, state, replicas)

    async def _place_now(
        self, fleet: str, address: str, spec: RunSpec, state: State, replicas: int | None
    ) -> list[Machine]:
        load = await fleet_load(self.machines, fleet, state, self.deployment)
        if not load.candidates:
            raise NoCapacity(
                fleet, f"no host of the fleet can take jobs now ({load.why_none()})", address
            )
        run = HostRun(address, address.split(".", 1)[1], spec, starts=True, replicas=replicas)
        # a scale-up adds to what the run holds: its own jobs count as busy then
        deployment = None if replicas is not None else self.deployment
        placement = place_on_fleet(
            [run],
            load.candidates,
            load.busy,
            deployment,
            load.labels,
            load.bandwidth,
            volume_sites(state),
        ).placements
        if not placement[address].placed:
            error = NoCapacity if placement[address].pending else ProviderError
            raise error(fleet, placement[address].note or "cannot be placed", address)
        return [load.machines[h] for h in placement[address].hosts]

    async def _agents(self, fleet: str, hosts: set[str], state: State) -> dict[str, AgentClient]:
        return {h: await self.machines.agent(fleet, h, state) for h in hosts}

    async def _fleet_hosts(self, fleet: str, state: State) -> set[str] | None:
        """The hosts `fleet` has now (none: a cloud fleet whose machines were released);
        None when the fleet is gone from state, or an engine cluster (only the recorded
        hosts are known)."""
        if self.machines.is_engine(fleet, state):
            return None
        try:
            return {m.host for m in await self.machines.machines(fleet, state)}
        except ProviderError:
            return None

    async def _listing(self, fleet: str, host: str, state: State) -> dict[str, JobInfo] | None:
        """The jobs on `host` by id; None when an SSH host cannot be asked (the local agent's
        errors are raised: it is this machine). A host no longer in its fleet has none: its
        jobs went with it (drift the plan repairs)."""
        if not self.machines.has_host(fleet, host, state):
            return {}
        agent = await self.machines.jobs_api(fleet, host, state)  # no I/O: a missing fleet raises
        try:
            return {j.id: j for j in await self.machines.jobs(fleet, host, state, agent=agent)}
        except DstackPlanError:
            if fleet == LOCAL_FLEET:
                raise
            return None

    async def _infos(
        self, fleet: str, jobs: Sequence[JobRecord], state: State
    ) -> dict[str, JobInfo]:
        found: dict[str, JobInfo] = {}
        for job in jobs:
            agent = await self.machines.jobs_api(fleet, job.host, state)
            try:
                found[job.id] = await agent.get_job(job.id)
            except AgentError as e:
                if e.status != 404:
                    raise
        return found

    async def _stop_and_remove(
        self,
        fleet: str,
        jobs: Sequence[JobRecord],
        spec: RunSpec,
        state: State,
        reason: str | None = None,
    ) -> None:
        by_host: dict[str, list[str]] = {}
        for job in jobs:
            by_host.setdefault(job.host, []).append(job.id)
        for host, ids in by_host.items():
            agent = await self.machines.jobs_api(fleet, host, state)
            await self._stopped(fleet, host, agent, ids, spec, reason)

    async def _stopped(
        self,
        fleet: str,
        host: str,
        agent: JobsAPI,
        ids: list[str],
        spec: RunSpec,
        reason: str | None = None,
        keep: Collection[str] = (),
    ) -> None:
        """`_stop_and_remove` on `fleet`'s machine `host`, the command's listing of it told
        (`fleets/listings.py`): the jobs removed are gone, those kept have ended."""
        key = self.machines.machine_key(fleet, host)
        try:
            ended = await _stop_and_remove(agent, ids, spec, reason, keep)
        except BaseException:
            self.machines.listings.relist(fleet)  # some stopped, some not: ask again
            raise
        self.machines.listings.forget(key, (i for i in ids if i not in ended))
        self.machines.listings.record(key, ended.values())


async def _stop_and_remove(
    agent: JobsAPI,
    ids: list[str],
    spec: RunSpec,
    reason: str | None = None,
    keep: Collection[str] = (),
) -> dict[str, JobInfo]:
    """Stop the jobs `ids` on `agent` (each within its graceful window, ending with `reason`,
    default the user's) and remove them, but those in `keep` (stopped only): how those
    ended, by id."""
    timeout = stop_seconds(spec)
    limit = asyncio.Semaphore(MAX_CONCURRENT_STOPS)
    ended: dict[str, JobInfo] = {}

    async def one(job_id: str) -> None:
        async with limit:
            try:
                # a stop answers with the job (one that ended is left as it ended): no
                # request to ask first, which over SSH is a channel per job; one removed
                # as well needs nothing more
                if job_id in keep:
                    info = await agent.stop(job_id, timeout=timeout, reason=reason)
                else:
                    info, removed = await agent.stop_and_remove(job_id, timeout, reason)
                    if removed:
                        return
                if not info.finished:
                    info = await agent.wait(job_id, timeout=timeout + STOP_WAIT_SLACK)
                if job_id not in keep:
                    await agent.delete(job_id, force=True)
                else:
                    ended[job_id] = info
            except AgentError as e:
                if e.status != 404:
                    raise

    # all jobs stop in parallel (each may wait out its graceful window), at most N at once
    await asyncio.gather(*(one(i) for i in ids))
    return ended


def _unused_generation(
    generation: int,
    run_name: str,
    deployment: str,
    slots_: Sequence[JobSlot],
    current: ResourceState,
    ctx: ApplyContext,
) -> int:
    """`generation`, unless a job of an earlier attempt of the run (kept on its agent,
    finished: `runs/attempts.py`) has the id a new job of `slots_` would get with it: then
    one from the clock (ms), which no kept job has."""
    kept = kept_job_ids(current.attributes)

    def taken(g: int) -> bool:
        return any(job_id(run_name, s, g, deployment) in kept for s in slots_)

    if not taken(generation):
        return generation
    fresh = int(ctx.clock.now() * 1000)
    while taken(fresh):
        fresh += 1
    return fresh


def fleet_of(run: ResourceState) -> str:
    """The fleet a run in state is on, as its create recorded it (`local` before fleets)."""
    return RunRecord.of(run).fleet


def _owner(change: ResourceChange, state: State) -> dict[str, Any]:
    """The `namespace` and `user` attributes of a run `change` records (defaults left out)."""
    record = RunRecord(namespace=namespace_of(change.after or {}), user=_applier(change, state))
    return {k: v for k, v in record.to_json().items() if k in ("namespace", "user")}


def _applier(change: ResourceChange, state: State) -> str:
    """Who the run counts against: whoever applies it; for a run watch starts again (a
    retry, a queued or scheduled run: a create of an entry that exists), who applied it."""
    if change.action is Action.CREATE:
        entry = state.get(change.address)
        if entry is not None and entry.kind in RUN_KINDS:
            user = RunRecord.of(entry).user
            if user is not None:
                return user
    return current_user()


def _machine_key(fleet: str, host: str) -> str:
    """The local fleet has one machine, whatever name its older records give it."""
    return "" if fleet == LOCAL_FLEET else host


def _hosts(record: RunRecord) -> set[str]:
    return {j.host for j in record.jobs}


def _machines_of(currents: Sequence[ResourceState]) -> dict[tuple[str, str], str]:
    """The machines the jobs of runs `currents` are on: (fleet, machine) -> a host name for
    it."""
    wanted: dict[tuple[str, str], str] = {}
    for current in currents:
        record = RunRecord.of(current)
        for host in _hosts(record):
            wanted.setdefault((record.fleet, _machine_key(record.fleet, host)), host)
    return wanted


def _listed(
    record: RunRecord, listings: Mapping[str, Mapping[str, JobInfo] | None]
) -> dict[str, JobInfo]:
    """What the listings of the run's hosts (by host) say of its jobs, by id: each looked up
    where it runs, and in its other hosts' only when not there. Never a merged copy of the
    listings: a host's holds every job on it (10,000 on one machine), and a copy per run was
    quadratic."""
    found: dict[str, JobInfo] = {}
    for job in record.jobs:
        there = listings.get(job.host)
        info = there.get(job.id) if there is not None else None
        if info is None:
            info = next((o[job.id] for o in listings.values() if o and job.id in o), None)
        if info is not None:
            found[job.id] = info
    return found


def _job_record(job: Submitted, gpus: Mapping[tuple[int, int], float]) -> JobRecord:
    """The record of a job just submitted; `gpus`: what each (replica, node) holds."""
    slot = (job.slot.replica, job.slot.node)
    return JobRecord.of_job(job.info, *slot, host=job.machine.host, gpus=gpus.get(slot))


def _refreshed(
    current: ResourceState, record: RunRecord, known: Mapping[str, JobInfo]
) -> Refreshed:
    """A run's refreshed status and job records, from the jobs its agents know (by id)."""
    found = [(r, known[r.id]) for r in record.jobs if r.id in known]
    if not found:
        attributes = dict(current.attributes)
        if current.status in FINISHED_STATUSES or (not record.jobs and scaled_to_zero(current)):
            return Refreshed(current.status, attributes)
        return Refreshed(current.status, attributes, gone="jobs are gone from the agent")
    infos = {r.id: info for r, info in found}
    jobs = [r.refreshed(infos[r.id]) if r.id in infos else r for r in record.jobs]
    attributes = {**current.attributes, "jobs": [j.to_json() for j in jobs]}
    status = run_status([info for _, info in found])
    if status == "failed" and retry_due_at(attributes) is not None:
        status = "pending"  # its retry resubmits it (watch/retries.py): not failed yet
    if _stopped_while_waiting(current) and status in FINISHED_STATUSES:
        status = "terminated"  # its jobs had failed before; the user ended it
    return Refreshed(status, attributes, crashed=crash(current.kind, current.name, found))


def _stopped_while_waiting(run: ResourceState) -> bool:
    """The user stopped `run` after its jobs had ended (waiting for its retry): `dstack
    stop` recorded it `terminated`, which its failed jobs must not turn back."""
    reason = run.attributes.get("termination_reason")
    return run.status == "terminated" and reason == STOPPED_BY_USER
