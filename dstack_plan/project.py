"""The public Python API: load -> refresh -> plan -> apply / destroy.

Everything the CLI does goes through `Project`; the CLI only parses flags and renders.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstack_plan.apply.deployment import Deployment
from dstack_plan.apply.handlers import ApplyContext, Refreshed, ResourceHandler
from dstack_plan.apply.records import for_handler
from dstack_plan.clock import Clock, SystemClock
from dstack_plan.config.gcpause import gc_paused
from dstack_plan.config.interpolation import referenced_secrets
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.label_options import with_run_labels
from dstack_plan.config.loader import load_project, start_loading
from dstack_plan.config.project_name import own_project_name
from dstack_plan.config.resource import Desired, Resource
from dstack_plan.config.runs import RunSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import PlanError, ProviderError
from dstack_plan.fleets.claims import Claimant
from dstack_plan.fleets.handler import FleetKinds
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.fleets.plan_offers import planned_fleet_offers
from dstack_plan.fleets.ssh import FleetHandler
from dstack_plan.gateways.handler import GatewayHandler
from dstack_plan.plan import submissions
from dstack_plan.plan.diff import diff_specs
from dstack_plan.plan.limits import checked_dependencies
from dstack_plan.plan.model import DEPOSED_KEY, Action, Crash, Placement, Plan
from dstack_plan.plan.normalize import CODE_KEY
from dstack_plan.plan.planner import DesiredItem, PlanInputs, PlanOptions, make_plan
from dstack_plan.providers.base import Provider
from dstack_plan.providers.local import LOCAL_FLEET, LOCAL_PROVIDER, LocalProvider
from dstack_plan.providers.registry import create_provider, provider_class
from dstack_plan.providers.ssh.pins import MemoryHostKeyStore
from dstack_plan.runs.dev_ssh import DevSSHRunHandler
from dstack_plan.runs.plan_placement import RunPlacement, fleet_of
from dstack_plan.runs.quota_gate import check_plan
from dstack_plan.runs.volume_attach import VolumeAttacher
from dstack_plan.sharing.imports import Imports, is_imported
from dstack_plan.state.backend import StateBackend, StateSnapshot
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.lock import hold_lock
from dstack_plan.state.model import ResourceState, State
from dstack_plan.state.secrets import SecretGuard
from dstack_plan.state.select import open_backend
from dstack_plan.volumes.handler import VolumeHandler

if TYPE_CHECKING:  # only apply needs these; planning does not import the apply engine
    from dstack_plan.apply.events import EventCallback
    from dstack_plan.apply.interrupt import Interrupt
    from dstack_plan.apply.report import ApplyReport
    from dstack_plan.config.fleet import SSHConfig
    from dstack_plan.fleets.apply_probe import PairScope
    from dstack_plan.fleets.cloud import CloudFleetHandler
    from dstack_plan.fleets.records import BandwidthRecord
    from dstack_plan.providers.configured import ConfiguredClouds
    from dstack_plan.providers.ssh.provider import SSHProvider
    from dstack_plan.runs.code_sources import PrivatePaths

SSH_AGENT_DIR_ENV = "DSTACK_PLAN_SSH_AGENT_DIR"
"""Where the agent goes on SSH fleet hosts (default: `.dstack-plan/agent` under the login
user's home; relative paths are under it too)."""
CLOUD_BOOT_TIMEOUT_ENV = "DSTACK_PLAN_CLOUD_BOOT_TIMEOUT"
"""Seconds a new cloud machine gets to be reachable over SSH (default 900)."""


@dataclass
class Refresh:
    """State as it really is: statuses from agents, what vanished and what crashed (drift)."""

    snapshot: StateSnapshot
    state: State
    drift: dict[str, str] = field(default_factory=dict)
    crashed: dict[str, Crash] = field(default_factory=dict)
    short: dict[str, str] = field(default_factory=dict)
    """Resources that have less than their spec asks (`Refreshed.short`), with why."""


class Project:
    """A directory of `*.dstack.yml` files and the state they are applied to."""

    def __init__(
        self,
        directory: str | Path = ".",
        files: tuple[str, ...] = (),
        *,
        state_path: str | Path | None = None,
        stdin: str | None = None,
        agent_dir: str | Path | None = None,
        clock: Clock | None = None,
        run_args: str = "",
        progress: Callable[[str, str], None] | None = None,
        labels: Mapping[str, str] | None = None,
        configs: Sequence[Resource] = (),
        submit: bool = False,
    ):
        self.directory = Path(directory)
        self.files = files
        self.configs = tuple(configs)
        """Resources declared in Python (`dstack_plan.sdk`'s builders), beside the files'."""
        self.submission = submit or bool(files)
        """Plans create or update only what the `files` (or, with `submit`, only what the
        `configs`) hold and delete nothing else, as `dstack apply -f` does
        (`plan/submissions.py`); else the directory's files are reconciled with the state."""
        self.stdin = stdin
        self.clock = clock or SystemClock()
        self.run_args = run_args
        self.guard = SecretGuard()
        # --state (a path or s3:// URL), $DSTACK_STATE, .dstack/backend.yml, .dstack/state.json
        self.backend: StateBackend = open_backend(
            self.directory, state_path, secret_guard=self.guard
        )
        self.secrets = SecretStore(self.directory, on_resolve=self.guard.register)
        self.local = _local_provider(agent_dir)
        self.imports = Imports(self.directory, self.name)
        """Other projects' states and fleets, read when a run names one (`owner/fleet`)."""
        self.machines = FleetMachines(self.local, self.ssh_provider, imports=self.imports)
        """Every fleet's machines and agents, for runs; one SSH connection per host."""
        self.deployment = Deployment(self.backend)  # keyed by lineage, read when needed
        self._progress = progress or (lambda address, message: None)
        self.labels: dict[str, str] = dict(labels or {})
        """`--label KEY=VALUE`: added to every run's `labels:` when the configuration loads
        (`config/labels.py`), so the plan, a saved plan and state hold them."""
        self.force = False
        """`apply --force`: drain SSH hosts that leave their fleet instead of refusing;
        `destroy --force`: forget hosts that cannot be cleaned, and stop other projects'
        jobs on hosts this project releases."""
        self._private_paths: PrivatePaths | None = None
        self.take_over = False
        """`apply --take-over`: move the claim of hosts another project's fleet owns to this
        project's fleet (refused while the owner's jobs run there)."""
        self._clouds: ConfiguredClouds | None = None
        self._desired: Desired | None = None
        self._ssh_class: Callable[..., Provider] | None = None
        self._containers_of: tuple[Desired, dict[str, bool]] | None = None
        self._context: dict[str, ResourceState] = {}
        """A submission's context: state entries its runs may refer to, by address."""

    @property
    def clouds(self) -> ConfiguredClouds:
        """The cloud providers `.dstack/backends.yml` configures, built when first used."""
        if self._clouds is None:
            from dstack_plan.providers.configured import ConfiguredClouds

            self._clouds = ConfiguredClouds(self.directory)
        return self._clouds

    # -- loading -------------------------------------------------------------------------

    def load(self) -> Desired:
        if self._desired is None:
            self._desired = self._declared(self._load_files())
        return self._desired

    def _load_files(self) -> Desired:
        if self._configs_only:
            return Desired()
        return load_project(self.directory, self.files, stdin=self.stdin)

    @property
    def _configs_only(self) -> bool:
        """A submission of Python configurations alone: no file of the directory is read."""
        return self.submission and not self.files

    def desired_items(self, *, local_facts: bool = False) -> list[DesiredItem]:
        """The declared resources as the planner takes them, checked as `validate` checks
        them; with `local_facts` (a plan, which apply follows), also that what this machine
        must hold for them is there (the SSH fleets' key files: `plan/host_checks.py`)."""
        desired = self.load()
        edges = checked_dependencies(desired, self.directory, local_facts=local_facts)
        fleets = {r.name: r for r in desired.of_kind("fleet")}
        items = []
        for resource in desired:
            context = self._context.get(resource.address)
            if context is not None:  # as recorded: a submission never changes its context
                items.append(submissions.context_item(context))
                continue
            spec = resource.normalized
            if resource.kind in RUN_KINDS:
                spec = self._with_code(resource, spec)
            items.append(
                DesiredItem(
                    address=resource.address,
                    kind=resource.kind,
                    name=resource.name,
                    provider=_provider_of(resource, fleets),
                    spec=spec,
                    depends_on=edges[resource.address],
                    secrets=_secrets(resource, spec),
                )
            )
        return items

    def _with_code(self, resource: Resource, spec: dict[str, Any]) -> dict[str, Any]:
        """`spec` with the fingerprint of the local files the run sends, if any: a change of
        their content is a change of the run."""
        from dstack_plan.runs.code_archive import code_fingerprint

        run = resource.spec
        assert isinstance(run, RunSpec)
        if not run.files and not run.repos:
            return spec
        where = self.code_dir(resource.address)
        found = code_fingerprint(run, where, run=resource.address, private=self.private_paths())
        return spec if found is None else {**spec, CODE_KEY: found}

    def private_paths(self) -> PrivatePaths:
        """What runs' `files:` and `repos:` never send: the project's `.dstack/` and its local
        state's directory (or, beside the project's files, the state's own files)."""
        if self._private_paths is None:  # the same for every run: resolved once
            from dstack_plan.runs import code_sources

            state = self.backend.path if isinstance(self.backend, LocalBackend) else None
            self._private_paths = code_sources.private_paths(self.directory, state)
        return self._private_paths

    def code_dir(self, address: str) -> Path:
        """Where the relative `files:` and `repos:` paths of run `address` start: the
        directory of its config file (the project directory for stdin)."""
        resource = self.load().resources.get(address)
        if resource is None or resource.source.file.startswith("<"):
            return self.directory
        return (self.directory / resource.source.file).parent

    # -- handlers ------------------------------------------------------------------------

    def handlers(self) -> dict[str, ResourceHandler]:
        fleets = self._fleet_handler()
        runs = DevSSHRunHandler(
            self.machines,
            self.secrets,
            self.deployment,
            self.code_dir,
            grow=fleets.grow,
            private=self.private_paths,
            volumes=VolumeAttacher(self.clouds),
        )
        return {
            "task": runs,
            "service": runs,
            "dev-environment": runs,
            "fleet": fleets,
            "volume": VolumeHandler(self.clouds),
            "gateway": GatewayHandler(self.machines),
        }

    @property
    def name(self) -> str:
        """The project's name, as other projects are told it: its directory's."""
        return own_project_name(self.directory)

    def claimant(self) -> Claimant:
        """This project as the claimant of the hosts its fleets enroll (`fleets/claims.py`)."""
        return Claimant(self.name, self.backend.locator, self.take_over)

    def _fleet_handler(self) -> FleetKinds:
        ssh = FleetHandler(
            self.ssh_provider, self.machines.kept_provider, self._probe_on_apply, self.claimant()
        )

        def cloud() -> CloudFleetHandler:
            from dstack_plan.fleets.cloud import BOOT_TIMEOUT, CloudFleetHandler

            boot = os.environ.get(CLOUD_BOOT_TIMEOUT_ENV)
            try:
                timeout = float(boot) if boot else BOOT_TIMEOUT
            except ValueError:
                raise PlanError(
                    f"{CLOUD_BOOT_TIMEOUT_ENV}: expected seconds, got {boot!r}"
                ) from None
            return CloudFleetHandler(ssh, self.clouds, boot_timeout=timeout)

        def engine(provider: str) -> ResourceHandler:
            from dstack_plan.fleets.engines import fleet_handler

            return fleet_handler(provider, self.machines.engine_of)

        return FleetKinds(ssh, cloud, engine)

    async def _probe_on_apply(self, fleet: str, state: State, scope: PairScope) -> BandwidthRecord:
        """The links between the pairs of hosts of `scope` of a fleet apply just provisioned,
        measured briefly (`fleets/apply_probe.py`)."""
        from dstack_plan.fleets.apply_probe import APPLY_PROBE_SECONDS
        from dstack_plan.fleets.probe import probe_pairs

        return await probe_pairs(
            self.machines,
            fleet,
            state,
            self.clock,
            scope.pairs,
            seconds=APPLY_PROBE_SECONDS,
            budget=scope.budget,
            parallelism=scope.parallelism,
        )

    def ssh_provider(self, fleet: str, config: SSHConfig, pins: MemoryHostKeyStore) -> SSHProvider:
        """A provider of the hosts `config` lists for `fleet`, found through the registry,
        checking host keys against `pins` (and ~/.ssh/known_hosts where it knows a host)."""
        from dstack_plan.providers.ssh.install import DEFAULT_AGENT_DIR
        from dstack_plan.providers.ssh.models import targets_from_config
        from dstack_plan.providers.ssh.provider import SSHProvider

        if self._ssh_class is None:  # the registry reads package metadata: once a project
            self._ssh_class = provider_class("ssh")
        make: Callable[..., Provider] = self._ssh_class
        containers = self._container_fleets()
        provider = make(
            fleets={fleet: targets_from_config(config)},
            host_keys=pins,
            agent_dir=os.environ.get(SSH_AGENT_DIR_ENV) or DEFAULT_AGENT_DIR,
            need_containers=fleet in containers,
            need_gpu_containers=containers.get(fleet, False),
            clock=self.clock,
        )
        if not isinstance(provider, SSHProvider):  # fleets read what only it records
            raise ProviderError("ssh", f"{type(provider).__name__} is not SSHProvider")
        return provider

    def _container_fleets(self) -> dict[str, bool]:
        """The fleets a run of the configuration goes to with an `image:` (their hosts'
        pre-flight then checks Docker), each with whether such a run wants GPUs (then the
        NVIDIA runtime is checked where hosts have NVIDIA GPUs: a CPU-only container needs
        none). Empty when no configuration was loaded (destroy)."""
        from dstack_plan.runs.usage import run_gpus

        desired = self._desired
        if desired is None:
            return {}
        if self._containers_of is None or self._containers_of[0] is not desired:
            fleets = {r.name: r for r in desired.of_kind("fleet")}
            wanted: dict[str, bool] = {}
            for r in desired:
                if isinstance(r.spec, RunSpec) and r.spec.image:
                    fleet = fleet_of(r, fleets)
                    wanted[fleet] = wanted.get(fleet, False) or run_gpus(r.spec) > 0
            self._containers_of = (desired, wanted)
        return self._containers_of[1]

    def unsupported(self, items: list[DesiredItem]) -> dict[tuple[str, str], str]:
        """(kind, provider) -> why apply cannot create or update such a resource, for the
        pairs `items` hold, as the handlers answer (the plan refuses them)."""
        handlers = self.handlers()
        answers: dict[tuple[str, str], str | None] = {}
        for item in items:
            key = (item.kind, item.provider)
            if key not in answers:
                answers[key] = handlers[item.kind].cannot_create(*key)
        return {key: reason for key, reason in answers.items() if reason is not None}

    def context(self, state: State | None = None) -> ApplyContext:
        """What handlers get; `state` is the one they read fleets from (default: the state as
        it is stored now, read when first needed)."""
        return ApplyContext(
            project_dir=str(self.directory),
            clock=self.clock,
            run_args=self.run_args,
            progress=self._progress,
            state=(lambda: state) if state is not None else self._stored_state,
            force=self.force,
        )

    def _stored_state(self) -> State:
        return self.backend.read().state

    # -- refresh, plan -------------------------------------------------------------------

    async def refresh(self, snapshot: StateSnapshot | None = None) -> Refresh:
        """Read the state (unless given the snapshot just read) and ask agents and providers
        what exists now. Nothing is written."""
        if snapshot is None:
            snapshot = self.backend.read()
        self.deployment.remember(snapshot)
        handlers = self.handlers()
        ctx = self.context(snapshot.state)
        # one batch per handler, so a handler can ask each agent or provider once for all
        batches: dict[int, tuple[ResourceHandler, list[ResourceState]]] = {}
        for current in snapshot.state.resources.values():
            if current.tainted:
                continue
            handler = handlers[current.kind]
            batches.setdefault(id(handler), (handler, []))[1].append(for_handler(current))
        # side by side: each batch reads the state as it was, and waits on its own hosts
        found: dict[str, Refreshed] = {}
        for answer in await asyncio.gather(
            *(handler.refresh_many(currents, ctx) for handler, currents in batches.values())
        ):
            found.update(answer)
        drift: dict[str, str] = {}
        crashed: dict[str, Crash] = {}
        short: dict[str, str] = {}
        changed: dict[str, ResourceState] = {}
        for address, current in snapshot.state.resources.items():
            if address not in found:  # tainted: the plan replaces it whatever exists
                continue
            refreshed = found[address]
            if refreshed.gone:
                drift[address] = refreshed.gone
            if refreshed.crashed is not None:
                crashed[address] = refreshed.crashed
            if refreshed.short is not None:
                short[address] = refreshed.short
            attributes = dict(refreshed.attributes)
            if DEPOSED_KEY in current.attributes:
                attributes[DEPOSED_KEY] = current.attributes[DEPOSED_KEY]
            if refreshed.status == current.status and attributes == current.attributes:
                continue  # what `updated` would return unchanged, without re-validating it
            changed[address] = current.refreshed(refreshed.status, attributes)
        state = snapshot.state
        if changed:
            state = state.model_copy(update={"resources": {**state.resources, **changed}})
        return Refresh(snapshot, state, drift, crashed, short)

    async def plan(self, options: PlanOptions | None = None) -> tuple[Plan, Refresh]:
        options = options or PlanOptions()
        # A plan builds many small objects that all stay alive (specs, state, changes); the
        # cyclic GC would rescan them again and again for nothing (a quarter of the time of
        # a large plan). It is back on when the plan is made. Each machine's jobs are listed
        # once for the refresh and the placements (`fleets/listings.py`).
        with gc_paused(), self.machines.listings.kept():
            snapshot = await self._read_state_while_loading(load=not options.destroy)
            if self.submission and not options.destroy:
                options = self._submission_options(snapshot.state, options)
            items = [] if options.destroy else self.desired_items(local_facts=True)
            refresh = await self.refresh(snapshot)
            placements = {} if options.destroy else await self.placements(items, refresh, options)
            unsupported = self.unsupported(items)
            if not options.destroy:
                placements.update(
                    await self.fleet_offers(
                        items, refresh.state, options, unsupported, frozenset(refresh.short)
                    )
                )
            plan = make_plan(
                PlanInputs(
                    desired=items,
                    state=refresh.state,
                    state_exists=refresh.snapshot.exists,
                    drift=refresh.drift,
                    placements=placements,
                    options=options,
                    crashed=refresh.crashed,
                    short=refresh.short,
                    unsupported=unsupported,
                    expired={} if options.destroy else self._expired(refresh.state),
                )
            )
            if not options.destroy:  # what it starts must fit the quotas (PlanError if not)
                now = self.clock.now()
                check_plan(plan, refresh.state, self.directory, now, imports=self.imports)
                self._refuse_unusable_gateways(plan)
                await self._refuse_claimed_hosts(plan, refresh)
                plan = self._with_drain_warnings(plan, refresh.state)
        return plan, refresh

    @staticmethod
    def _with_drain_warnings(plan: Plan, state: State) -> Plan:
        """`plan` warning of the hosts it removes from SSH fleets while jobs run there,
        which apply refuses without --force (`runs/draining.py`)."""
        from dstack_plan.runs.draining import drain_warnings

        found = drain_warnings(plan, state)
        return plan.model_copy(update={"warnings": plan.warnings + found}) if found else plan

    def _refuse_unusable_gateways(self, plan: Plan) -> None:
        """PlanError naming each service the plan starts on another project's gateway that
        this project cannot use (`gateways/served.py`)."""
        from dstack_plan.gateways.served import imported_gateway_problems

        problems = imported_gateway_problems(plan, self.name, self.imports)
        if problems:
            raise PlanError("\n".join(problems))

    async def _refuse_claimed_hosts(self, plan: Plan, refresh: Refresh) -> None:
        """PlanError naming each host another project's fleet owns among those the plan adds
        to SSH fleets (asked over SSH, nothing started; `fleets/claims.py`)."""
        from dstack_plan.fleets.claims import refuse_claimed_hosts

        lineage = refresh.state.lineage if refresh.snapshot.exists else None
        await refuse_claimed_hosts(plan, lineage, self.ssh_provider, self.claimant())

    def _submission_options(self, state: State, options: PlanOptions) -> PlanOptions:
        """Plan the submission against its context from `state` (`plan/submissions.py`)."""
        if options.prune:
            raise PlanError(
                "--prune deletes what a directory's files do not declare: it does not go with "
                "-f (a submission deletes nothing)"
            )
        found = submissions.with_state_context(self.load(), state)
        self._desired, self._context = found.desired, found.context
        return options._replace(submission=True, context=tuple(found.context))

    def _expired(self, state: State) -> dict[str, str]:
        """Submitted runs whose retention ended: the plan removes them from state."""
        from dstack_plan.runs.records import RunRecord

        ended: dict[str, float] = {}
        for address, entry in state.resources.items():
            if not entry.submitted or entry.kind not in RUN_KINDS:
                continue
            jobs_finished = (j.finished_at for j in RunRecord.of(entry).jobs)
            end = submissions.finished_at(entry, jobs_finished)
            if end is not None:
                ended[address] = end
        retention = submissions.submitted_retention()
        return submissions.expired(ended, state, self.clock.now(), retention)

    async def _read_state_while_loading(self, load: bool) -> StateSnapshot:
        """Read the state while the other cores parse the configuration, then ask the agents
        for the jobs of the state's runs while the parsing ends (in a thread: the answers
        are read meanwhile). For a large project these are a plan's slowest steps, and none
        of them waits for another: each agent builds its listing while this process parses."""
        if not load or self._desired is not None or self._configs_only:
            return self.backend.read()
        loading = start_loading(
            self.directory,
            self.files,
            stdin=self.stdin,
            busy_state_bytes=self._state_size(),
            normalize=True,
        )
        try:
            snapshot = self.backend.read()
            await self._start_run_listings(snapshot.state)
        except BaseException:
            loading.cancel()
            raise
        self._desired = self._declared(await asyncio.to_thread(loading.finish))
        return snapshot

    async def _start_run_listings(self, state: State) -> None:
        """Send the job listing requests the refresh of `state`'s runs will make."""
        runs = self.handlers()["task"]
        assert isinstance(runs, DevSSHRunHandler)
        currents = [
            for_handler(entry)
            for entry in state.resources.values()
            if entry.kind in RUN_KINDS and not entry.tainted
        ]
        await runs.start_listings(currents, state)

    def _declared(self, loaded: Desired) -> Desired:
        """What the files declare, with the resources given in Python and the run labels."""
        if self.configs:
            loaded = _with_configs(loaded, self.configs)
        return with_run_labels(loaded, self.labels)

    def _state_size(self) -> int:
        """Bytes of the local state file (0 for other backends), read while the files load."""
        if not isinstance(self.backend, LocalBackend):
            return 0
        try:
            return self.backend.path.stat().st_size
        except OSError:
            return 0

    async def placements(
        self,
        items: list[DesiredItem],
        refresh: Refresh | None = None,
        options: PlanOptions | None = None,
    ) -> dict[str, Placement]:
        """Where each run would go, by the same rules apply uses (`runs/plan_placement.py`).
        `refresh` and `options` tell which runs the plan starts (without them, every run
        counts as a create)."""
        state = refresh.state if refresh is not None else self.backend.read().state
        by_address = {item.address: item for item in items}
        return await self._placer().placements(
            self.load(), by_address, state, lambda a: _starts(by_address.get(a), refresh, options)
        )

    async def fleet_offers(
        self,
        items: list[DesiredItem],
        state: State,
        options: PlanOptions | None = None,
        unsupported: Mapping[tuple[str, str], str] | None = None,
        short: frozenset[str] = frozenset(),
    ) -> dict[str, Placement]:
        """What each cloud fleet the plan creates or changes will be made of
        (`fleets/plan_offers.py`). PlanError when no offer allows them."""
        targets = options.targets if options is not None else ()
        wanted = [
            item
            for item in items
            if (item.kind, item.provider) not in (unsupported or {})
            and (not targets or item.address in targets)
        ]
        return await planned_fleet_offers(wanted, state, lambda: self.clouds, short)

    def _placer(self) -> RunPlacement:
        return RunPlacement(self.machines, lambda: self.clouds, str(self.deployment), self.clock)

    # -- apply ---------------------------------------------------------------------------

    async def publish_policy(self) -> bool:
        """Publish in the state what the projects this one exports to must obey (the
        `projects:` of `.dstack/quotas.yml`: `sharing/policy.py`); True when that changed
        it. The caller holds the lock (apply)."""
        from dstack_plan.config.quotas import load_quotas
        from dstack_plan.sharing.policy import published
        from dstack_plan.state.commit import commit_async

        quotas = load_quotas(self.directory)
        current = (await asyncio.to_thread(self.backend.read)).state
        if current.policy == published(quotas, current.policy):
            return False
        # from the latest state: the owner's watch may have published who waits meanwhile
        await commit_async(
            self.backend,
            lambda s: s.model_copy(update={"policy": published(quotas, s.policy)}),
        )
        return True

    def locked(self, operation: str, timeout: float = 0.0) -> AbstractAsyncContextManager[Any]:
        """Hold the state's operation lock (apply, destroy) for the body."""
        return hold_lock(self.backend, operation, timeout=timeout, clock=self.clock)

    async def apply(
        self,
        plan: Plan,
        *,
        saved_plan: str | None = None,
        parallelism: int = 10,
        interrupt: Interrupt | None = None,
        on_event: EventCallback | None = None,
    ) -> ApplyReport:
        """Make the plan real; the caller holds the lock (`locked`).

        A saved plan is refused when the state moved on since it was made.
        """
        from dstack_plan.apply.engine import apply_plan
        from dstack_plan.plan.planfile import check_not_stale

        if saved_plan is not None:
            snapshot = self.backend.read()
            check_not_stale(plan, snapshot, saved_plan)
            # time went by since it was made: today's GPU-hours (and quotas) may have moved
            now = self.clock.now()
            check_plan(plan, snapshot.state, self.directory, now, imports=self.imports)
            self._refuse_unusable_gateways(plan)
        # every secret a change needs must resolve before anything is touched
        for change in plan.changes:
            if change.after is not None and change.action is not Action.NOOP:
                self.secrets.values(change.secrets)
        with self.machines.listings.kept():  # one job listing per machine (`fleets/listings.py`)
            return await apply_plan(
                plan,
                self.backend,
                self.handlers(),
                self.context(),
                parallelism=parallelism,
                interrupt=interrupt,
                on_event=on_event,
            )

    async def close(self) -> None:
        await self.machines.close()
        if self._clouds is not None:
            await self._clouds.close()


def _local_provider(agent_dir: str | Path | None) -> LocalProvider:
    """This machine's provider, found through the registry like any other."""
    provider = create_provider(LOCAL_PROVIDER, agent_dir=agent_dir)
    if not isinstance(provider, LocalProvider):  # the CLI reads what only it records
        raise ProviderError(LOCAL_PROVIDER, f"{type(provider).__name__} is not LocalProvider")
    return provider


def _provider_of(resource: Resource, fleets: dict[str, Resource]) -> str:
    spec = resource.spec
    if not isinstance(spec, RunSpec):
        return spec.provider  # a fleet, volume or gateway says where it lives
    named = spec.placement_fleets()
    fleet_name = named[0] if named else (next(iter(fleets)) if fleets else LOCAL_FLEET)
    if is_imported(fleet_name):
        return "ssh"  # another project's fleet: reached over SSH, as its owner's hosts
    if fleet_name == LOCAL_FLEET or fleet_name not in fleets:
        return LOCAL_PROVIDER
    return _provider_of(fleets[fleet_name], fleets)


def _secrets(resource: Resource, spec: dict[str, Any]) -> tuple[str, ...]:
    if not resource.may_reference:  # no `${{` anywhere in its file: nothing to look for
        return ()
    return tuple(sorted(referenced_secrets(spec)))


def _starts(
    item: DesiredItem | None, refresh: Refresh | None, options: PlanOptions | None
) -> bool:
    """Whether the plan starts the run (creates, replaces or scales it), as far as placement
    needs to know: a run it keeps as it is claims nothing new, so it is never refused."""
    if item is None:
        return False
    options = options or PlanOptions()
    if options.targets and item.address not in options.targets:
        return False
    if refresh is None or item.address in options.replace:
        return True
    current = refresh.state.resources.get(item.address)
    if current is None or current.tainted:
        return True
    if item.address in refresh.drift or item.address in refresh.crashed:
        return True
    return bool(diff_specs(item.kind, current.spec, item.spec).changed)


def _with_configs(loaded: Desired, configs: Sequence[Resource]) -> Desired:
    """The files' resources and those declared in Python; one address declared twice is a
    ConfigError naming both places."""
    from dstack_plan.errors import ConfigError, ConfigIssue

    resources = dict(loaded.resources)
    issues = []
    for resource in configs:
        other = resources.get(resource.address) or loaded.presets.get(resource.address)
        if other is not None:
            issues.append(
                ConfigIssue(
                    resource.source.file,
                    1,
                    1,
                    f"{resource.address} is also declared in {other.source}",
                )
            )
        resources[resource.address] = resource
    if issues:
        raise ConfigError(issues)
    return Desired(resources=resources, files=loaded.files, presets=dict(loaded.presets))
