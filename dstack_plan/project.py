"""The public Python API: load -> refresh -> plan -> apply / destroy.

Everything the CLI does goes through `Project`; the CLI only parses flags and renders.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstack_plan.apply.handlers import ApplyContext, Refreshed, ResourceHandler
from dstack_plan.apply.jobs import deployment_key
from dstack_plan.apply.records import for_handler
from dstack_plan.apply.runs import RunHandler
from dstack_plan.apply.unsupported import UnsupportedHandler
from dstack_plan.clock import Clock, SystemClock
from dstack_plan.config.interpolation import referenced_secrets
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.loader import load_project, start_loading
from dstack_plan.config.resource import Desired, Resource
from dstack_plan.config.runs import RunSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.gcpause import gc_paused
from dstack_plan.graph.references import dependencies
from dstack_plan.plan.model import DEPOSED_KEY, Action, Placement, Plan
from dstack_plan.plan.planner import DesiredItem, PlanInputs, PlanOptions, make_plan
from dstack_plan.providers.local import LOCAL_FLEET, LocalProvider
from dstack_plan.scheduler.placement import Candidate, place
from dstack_plan.state.backend import StateBackend, StateSnapshot
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.lock import hold_lock
from dstack_plan.state.model import ResourceState, State
from dstack_plan.state.secrets import SecretGuard

if TYPE_CHECKING:  # only apply needs these; planning does not import the apply engine
    from dstack_plan.apply.events import EventCallback
    from dstack_plan.apply.interrupt import Interrupt
    from dstack_plan.apply.report import ApplyReport

STATE_ENV = "DSTACK_STATE"
STATE_BYTES_PER_CONFIG_BYTE = 40
"""Reading a byte of state takes about a fortieth of the time loading (parsing, validating,
normalising, and handing back from another core) a byte of YAML configuration does: for
10,000 resources, 20 MB of state in 0.5 s, 3 MB of YAML in 2.3 s on two busy cores."""


@dataclass
class Refresh:
    """State as it really is: statuses from agents and what vanished (drift)."""

    snapshot: StateSnapshot
    state: State
    drift: dict[str, str] = field(default_factory=dict)


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
    ):
        self.directory = Path(directory)
        self.files = files
        self.stdin = stdin
        self.clock = clock or SystemClock()
        self.run_args = run_args
        self.guard = SecretGuard()
        path = state_path or os.environ.get(STATE_ENV) or self.directory / ".dstack" / "state.json"
        self.backend: StateBackend = LocalBackend(path, secret_guard=self.guard)
        self.secrets = SecretStore(self.directory, on_resolve=self.guard.register)
        self.local = LocalProvider(agent_dir)
        self.deployment = deployment_key(self.backend.location)
        self._progress = progress or (lambda address, message: None)
        self._desired: Desired | None = None

    # -- loading -------------------------------------------------------------------------

    def load(self) -> Desired:
        if self._desired is None:
            self._desired = load_project(self.directory, self.files, stdin=self.stdin)
        return self._desired

    def desired_items(self) -> list[DesiredItem]:
        desired = self.load()
        edges = dependencies(desired, self.directory)
        fleets = {r.name: r for r in desired.of_kind("fleet")}
        items = []
        for resource in desired:
            spec = resource.normalized
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

    # -- handlers ------------------------------------------------------------------------

    def handlers(self) -> dict[str, ResourceHandler]:
        runs = RunHandler(self.local, self.secrets, self.deployment)
        unsupported = UnsupportedHandler()
        return {
            "task": runs,
            "service": runs,
            "dev-environment": runs,
            "fleet": unsupported,
            "volume": unsupported,
            "gateway": unsupported,
        }

    def context(self) -> ApplyContext:
        return ApplyContext(
            project_dir=str(self.directory),
            clock=self.clock,
            run_args=self.run_args,
            progress=self._progress,
        )

    # -- refresh, plan -------------------------------------------------------------------

    async def refresh(self, snapshot: StateSnapshot | None = None) -> Refresh:
        """Read the state (unless given the snapshot just read) and ask agents and providers
        what exists now. Nothing is written."""
        if snapshot is None:
            snapshot = self.backend.read()
        handlers = self.handlers()
        ctx = self.context()
        # one batch per handler, so a handler can ask each agent or provider once for all
        batches: dict[int, tuple[ResourceHandler, list[ResourceState]]] = {}
        for current in snapshot.state.resources.values():
            if current.tainted:
                continue
            handler = handlers[current.kind]
            batches.setdefault(id(handler), (handler, []))[1].append(for_handler(current))
        found: dict[str, Refreshed] = {}
        for handler, currents in batches.values():
            found.update(await handler.refresh_many(currents, ctx))
        drift: dict[str, str] = {}
        changed: dict[str, ResourceState] = {}
        for address, current in snapshot.state.resources.items():
            if address not in found:  # tainted: the plan replaces it whatever exists
                continue
            refreshed = found[address]
            if refreshed.gone:
                drift[address] = refreshed.gone
            attributes = dict(refreshed.attributes)
            if DEPOSED_KEY in current.attributes:
                attributes[DEPOSED_KEY] = current.attributes[DEPOSED_KEY]
            if refreshed.status == current.status and attributes == current.attributes:
                continue  # what `updated` would return unchanged, without re-validating it
            changed[address] = current.updated(
                now=current.updated_at, status=refreshed.status, attributes=attributes
            )
        state = snapshot.state
        if changed:
            state = state.model_copy(update={"resources": {**state.resources, **changed}})
        return Refresh(snapshot, state, drift)

    async def plan(self, options: PlanOptions | None = None) -> tuple[Plan, Refresh]:
        options = options or PlanOptions()
        # A plan builds many small objects that all stay alive (specs, state, changes); the
        # cyclic GC would rescan them again and again for nothing (a quarter of the time of
        # a large plan). It is back on when the plan is made.
        with gc_paused():
            snapshot = self._read_state_while_loading(load=not options.destroy)
            items = [] if options.destroy else self.desired_items()
            refresh = await self.refresh(snapshot)
            placements = {} if options.destroy else await self.placements(items)
            plan = make_plan(
                PlanInputs(
                    desired=items,
                    state=refresh.state,
                    state_exists=refresh.snapshot.exists,
                    drift=refresh.drift,
                    placements=placements,
                    options=options,
                )
            )
        return plan, refresh

    def _read_state_while_loading(self, load: bool) -> StateSnapshot:
        """Read the state while the other cores parse the configuration: for a large project
        these are the two slowest steps of a plan, and they do not depend on each other."""
        if not load or self._desired is not None:
            return self.backend.read()
        loading = start_loading(
            self.directory,
            self.files,
            stdin=self.stdin,
            busy=self._state_read_cost(),
            normalize=True,
        )
        try:
            snapshot = self.backend.read()
        except BaseException:
            loading.cancel()
            raise
        self._desired = loading.finish()
        return snapshot

    def _state_read_cost(self) -> int:
        """What reading the state costs, in bytes of YAML that take as long to load."""
        if not isinstance(self.backend, LocalBackend):
            return 0
        try:
            return self.backend.path.stat().st_size // STATE_BYTES_PER_CONFIG_BYTE
        except OSError:
            return 0

    async def placements(self, items: list[DesiredItem]) -> dict[str, Placement]:
        """Where each run would go, by the same rules apply uses."""
        desired = self.load()
        runs = [r for r in desired if r.kind in RUN_KINDS]
        if not runs:
            return {}
        result: dict[str, Placement] = {}
        local_candidates: list[Candidate] | None = None
        fleets = {r.name: r for r in desired.of_kind("fleet")}
        providers = {item.address: item.provider for item in items}
        for resource in runs:
            spec = resource.spec
            assert isinstance(spec, RunSpec)
            fleet = _fleet_of(resource, fleets)
            if fleet != LOCAL_FLEET:
                result[resource.address] = Placement(
                    fleet=fleet,
                    provider=providers[resource.address],
                    note="machines known after apply",
                )
                continue
            if local_candidates is None:
                instance, free = await self.local.local_instance()
                local_candidates = [
                    Candidate(LOCAL_FLEET, "local", instance.hostname, instance.resources, free)
                ]
            jobs = _job_count(spec)
            decision = place(spec.resources, jobs, local_candidates, distinct=_multinode(spec))
            hosts = tuple(c.host for c in decision.hosts)
            result[resource.address] = Placement(
                fleet=LOCAL_FLEET,
                provider="local",
                hosts=hosts,
                price_per_hour=decision.price_per_hour,
                placed=decision.placed,
                note=None if decision.placed else f"cannot be placed: {decision.reason}",
            )
        return result

    # -- apply ---------------------------------------------------------------------------

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
            check_not_stale(plan, self.backend.read(), saved_plan)
        # every secret a change needs must resolve before anything is touched
        for change in plan.changes:
            if change.after is not None and change.action is not Action.NOOP:
                self.secrets.values(change.secrets)
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
        await self.local.close()


def _fleet_of(resource: Resource, fleets: dict[str, Resource]) -> str:
    """The fleet a run goes to: the first it names, else the first declared, else `local`."""
    spec = resource.spec
    assert isinstance(spec, RunSpec)
    named = spec.fleet_names()
    if named:
        return named[0]
    return next(iter(fleets), LOCAL_FLEET)


def _provider_of(resource: Resource, fleets: dict[str, Resource]) -> str:
    spec = resource.spec
    if not isinstance(spec, RunSpec):
        return spec.provider  # a fleet, volume or gateway says where it lives
    named = spec.fleet_names()
    fleet_name = named[0] if named else (next(iter(fleets)) if fleets else LOCAL_FLEET)
    if fleet_name == LOCAL_FLEET or fleet_name not in fleets:
        return "local"
    return _provider_of(fleets[fleet_name], fleets)


def _secrets(resource: Resource, spec: dict[str, Any]) -> tuple[str, ...]:
    if not resource.may_reference:  # no `${{` anywhere in its file: nothing to look for
        return ()
    return tuple(sorted(referenced_secrets(spec)))


def _job_count(spec: RunSpec) -> int:
    from dstack_plan.apply.jobs import slots

    return max(len(slots(spec)), 1)


def _multinode(spec: RunSpec) -> bool:
    from dstack_plan.config.runs import TaskSpec

    return isinstance(spec, TaskSpec) and spec.node_count() > 1
