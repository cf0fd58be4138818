"""What the API reads: the project's state, its agents, the event log and the metrics ring.

Nothing here writes state, takes the operation lock or the leader lease: each view is the one
the matching `--json` command prints (`ps`, `fleet list`, `top`, `events`). Every answer goes
through `redact` first: any value of a secret the project's runs refer to is replaced by
`(sensitive)` wherever it appears (a job that prints its token, say).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from dstack_plan.errors import DstackPlanError
from dstack_plan.state.events import REDACTED, Event, EventLog
from dstack_plan.web.snapshots import Snapshot

if TYPE_CHECKING:
    from dstack_plan.inspect.fleets import FleetList
    from dstack_plan.inspect.runs import RunView
    from dstack_plan.inspect.top import TopSampler, TopView
    from dstack_plan.project import Project
    from dstack_plan.state.model import ResourceState, State
    from dstack_plan.web.history import History
    from dstack_plan.web.models import MetricsHistory, PlanView

EVENTS_LIMIT = 1000
"""Events one answer holds at most (the last ones); `?limit=` asks for fewer or more."""


class NotFound(DstackPlanError):
    """What was asked for does not exist (a 404)."""


class ApiSource:
    """The read side of one project, for the routes."""

    def __init__(
        self,
        project: Project,
        *,
        new_project: Callable[[], Project],
        history: History | None = None,
    ) -> None:
        self.project = project
        self.new_project = new_project
        """A fresh `Project` for each plan: its configuration is read again every time."""
        self.history = history
        """The watch's metrics ring; None under `dstack ui` (nothing records samples)."""
        self._sampler: TopSampler | None = None
        self._top_lock = asyncio.Lock()
        self._plan_lock = asyncio.Lock()
        self._guarded: tuple[str, int] | None = None
        self._runs = {flag: Snapshot(partial(self._list_runs, flag)) for flag in (False, True)}
        self._hosts = Snapshot(self._sample_hosts)

    async def close(self) -> None:
        """Cancel the snapshots' fetches in flight."""
        for runs in self._runs.values():
            await runs.close()
        await self._hosts.close()

    # -- the views -------------------------------------------------------------------------

    def state(self) -> State:
        state = self.project.backend.read().state
        self._guard(state)
        return state

    async def runs(self, *, all_runs: bool = False) -> list[RunView]:
        """The runs as `ps --json` lists them (`-a` with `all_runs`), from a snapshot at most
        a couple of seconds old (`snapshots.py`): asking every agent takes longer."""
        self.state()
        return await self._runs[all_runs].get()

    async def _list_runs(self, all_runs: bool) -> list[RunView]:
        from dstack_plan.inspect.runs import list_runs

        return await list_runs(self.project, all_runs=all_runs)

    async def run(self, ref: str) -> RunView:
        from dstack_plan.inspect.runs import list_runs

        entry = self.find_run(ref)
        found = await list_runs(self.project, all_runs=True, addresses={entry.address})
        if not found:
            raise NotFound(f"no run {ref!r} in state")
        return found[0]

    def find_run(self, ref: str) -> ResourceState:
        from dstack_plan.inspect.runs import find_run

        try:
            return find_run(self.state(), ref)
        except DstackPlanError as e:
            raise NotFound(str(e)) from None

    def namespaces(self) -> dict[str, str]:
        """Run address -> its namespace (`default` when its spec names none)."""
        from dstack_plan.config.quotas import namespace_of
        from dstack_plan.inspect.runs import run_entries

        return {entry.address: namespace_of(entry.spec) for entry in run_entries(self.state())}

    async def fleets(self) -> FleetList:
        """The fleets as `fleet list --json` lists them, each host's status from what its
        agent answered in the `hosts` snapshot (`top`: the same agents, asked once)."""
        from dstack_plan.inspect.fleets import (
            fleet_list,
            fleet_records,
            imported_records,
            top_answers,
        )

        # this project's fleets, then those other projects export to it (`owner/name`)
        records = {**fleet_records(self.state()), **imported_records(self.project.imports)}
        return fleet_list(records, top_answers(await self.hosts()))

    async def hosts(self) -> TopView:
        """The hosts as `top --json` shows them, from a snapshot (as `runs`)."""
        return await self._hosts.get()

    async def _sample_hosts(self) -> TopView:
        from dstack_plan.inspect.top import TopSampler

        async with self._top_lock:  # the sampler keeps each host's last reading
            if self._sampler is None:
                self._sampler = TopSampler(self.project.machines, self.project.clock)
            return await self._sampler.snapshot(self.state())

    def events(
        self, since: float | None, address: str | None, limit: int = EVENTS_LIMIT
    ) -> list[Event]:
        self.state()
        found = EventLog(self.project.backend).read(since=since, address=address)
        return found[-limit:] if limit > 0 else []

    def metrics(self, since: float | None) -> MetricsHistory:
        from dstack_plan.web.history import MAX_AGE, MAX_SAMPLES
        from dstack_plan.web.models import MetricsHistory

        if self.history is None:
            return MetricsHistory(recording=False, max_samples=MAX_SAMPLES, max_age_s=MAX_AGE)
        return self.history.view(since)

    async def plan(self) -> PlanView:
        """The plan of the configuration now against the state now, as `dstack plan`
        computes it (agents and providers asked, nothing written, no lock taken)."""
        from dstack_plan.config.discover import has_config_files
        from dstack_plan.web.models import PlanView

        if not has_config_files(self.project.directory):
            raise NotFound(f"no *.dstack.yml files in {self.project.directory}: nothing to plan")
        self.state()
        async with self._plan_lock:  # one at a time: a plan asks every agent
            project = self.new_project()
            try:
                plan, _ = await project.plan()
            finally:
                await project.close()
        return PlanView(computed_at=self.project.clock.now(), plan=plan)

    # -- secrets ---------------------------------------------------------------------------

    def _guard(self, state: State) -> None:
        """Register the values of the secrets `state`'s resources refer to (once per state
        version), so `redact` knows them even in a process that never resolved them."""
        from dstack_plan.config.interpolation import referenced_secrets

        version = (state.lineage, state.serial)
        if self._guarded == version:
            return
        names: set[str] = set()
        for entry in state.resources.values():
            names |= referenced_secrets(entry.spec)
        for name in sorted(names):
            try:
                self.project.secrets.get(name)  # registers the value with project.guard
            except DstackPlanError:
                continue  # not set here: no value to look for
        self._guarded = version

    def redact(self, data: Any) -> Any:
        """`data` (JSON: dicts, lists, strings...) with every secret value replaced."""
        guard = self.project.guard
        if not len(guard):
            return data
        return _redact(data, lambda text: guard.redact(text, REDACTED))


def _redact(data: Any, clean: Callable[[str], str]) -> Any:
    if isinstance(data, str):
        return clean(data)
    if isinstance(data, dict):
        return {clean(k): _redact(v, clean) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_redact(v, clean) for v in data]
    return data
