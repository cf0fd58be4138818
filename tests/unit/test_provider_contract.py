"""The provider contract is the dividing line: callers reach providers only through it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.inspect.runs import job_agent, job_records
from dstack_plan.project import Project
from dstack_plan.providers.base import Instance, Offer, Provider
from dstack_plan.providers.capabilities import (
    CAPABILITY_OF_KIND,
    Gateway,
    ProviderWithGateways,
    ProviderWithVolumes,
    Volume,
    supports,
)
from dstack_plan.providers.local import LocalProvider
from dstack_plan.runs.handler import RunHandler
from dstack_plan.state import ResourceState


class ListingAgent:
    """An agent that knows one job (what refresh asks of it)."""

    def __init__(self) -> None:
        self.job = JobInfo(
            id="j-0", run_name="t", runtime="process", status="running", submitted_at=1.0
        )

    async def list_jobs(self, status: Any = None, run_name: Any = None) -> list[JobInfo]:
        return [self.job]


class PoolProvider(Provider):
    """A provider whose fleet `pool` has one machine of its own (as an SSH fleet will)."""

    name = "pool"

    def __init__(self) -> None:
        self.asked: list[Instance] = []
        self.client = ListingAgent()

    async def offers(self, requirements: ResourcesSpec | None = None) -> list[Offer]:
        return []

    async def create_instances(self, fleet: str, offer: Offer, count: int) -> list[Instance]:
        return []

    async def refresh(self, instances: Sequence[Instance]) -> list[Instance]:
        return list(instances)

    async def terminate(self, instances: Sequence[Instance]) -> None:
        return None

    async def agent(self, instance: Instance) -> Any:
        self.asked.append(instance)
        return self.client

    def implicit_instances(self, fleet: str) -> list[Instance]:
        return [Instance(provider="pool", id="h1", name="pool-0", fleet=fleet, hostname="h1")]


def no_ssh(*args: Any) -> Any:
    raise AssertionError("no SSH fleet here")


def run_on(fleet: str) -> ResourceState:
    from datetime import datetime, timezone

    return ResourceState.create(
        "task.t",
        provider="pool",
        spec={"name": "t"},
        status="running",
        now=datetime(2025, 1, 1, tzinfo=timezone.utc),
        attributes={"fleet": fleet, "jobs": [{"id": "j-0", "replica": 0, "node": 0}]},
    )


def test_runs_reach_the_agent_of_whatever_provider_the_resolver_gives() -> None:
    pool = PoolProvider()
    runs = RunHandler(FleetMachines(pool, no_ssh), SecretStore(Path(".")), "abc")
    found = asyncio.run(runs.refresh_many([run_on("pool")], ApplyContext()))
    assert found["task.t"].status == "running" and found["task.t"].gone is None
    assert [i.hostname for i in pool.asked] == ["h1"]  # its machine, through the contract


def test_a_fleet_with_no_machines_and_no_entry_in_state_is_a_clear_error() -> None:
    class Empty(PoolProvider):
        def implicit_instances(self, fleet: str) -> list[Instance]:
            return []

    runs = RunHandler(FleetMachines(Empty(), no_ssh), SecretStore(Path(".")), "abc")
    with pytest.raises(ProviderError, match="fleet 'pool' is not in state: apply it first"):
        asyncio.run(runs.refresh(run_on("pool"), ApplyContext()))


def test_the_read_side_reaches_agents_through_the_projects_fleet_resolver(
    tmp_path: Path,
) -> None:
    project = Project(tmp_path, state_path=tmp_path / "s.json", agent_dir=tmp_path / "a")
    pool = PoolProvider()
    project.machines = FleetMachines(pool, no_ssh)
    project.handlers = lambda: {}  # type: ignore[method-assign] - not asked any more
    run = run_on("pool")
    assert asyncio.run(job_agent(project, run, job_records(run)[0])) is pool.client


def test_the_local_provider_offers_this_machine_unless_it_can_never_fit(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "agent")

    async def ask() -> tuple[list[Offer], list[Offer], list[Offer]]:
        try:
            return (
                await provider.offers(),
                await provider.offers(ResourcesSpec.model_validate({"cpu": 1})),
                await provider.offers(ResourcesSpec.model_validate({"cpu": 100000})),
            )
        finally:
            await provider.close()

    every, small, huge = asyncio.run(ask())
    assert len(every) == 1 and every[0].resources.cpus >= 1
    assert small == every
    assert huge == []
    assert provider.started is None  # no agent was started to answer


def test_refresh_completes_this_machine_and_drops_any_other(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "agent")
    [partial] = provider.implicit_instances("local")
    assert partial.resources is None and provider.implicit_instances("pool") == []
    stranger = partial.model_copy(update={"id": "local:another-machine"})

    async def ask() -> list[Instance]:
        try:
            return await provider.refresh([partial, stranger])
        finally:
            await provider.close()

    [machine] = asyncio.run(ask())
    assert machine.id == partial.id and machine.resources is not None
    assert machine.resources.cpus >= 1


def test_volumes_and_gateways_are_capabilities_a_provider_opts_into() -> None:
    class WithVolumes(PoolProvider, ProviderWithVolumes):
        async def create_volume(self, spec: Any) -> Volume:
            return Volume(provider=self.name, id="v", name=spec.name, region="r")

        async def refresh_volumes(self, volumes: Sequence[Volume]) -> list[Volume]:
            return list(volumes)

        async def delete_volume(self, volume: Volume) -> None:
            return None

        async def attach_volume(self, volume: Volume, instance: Any) -> str:
            return "/dev/sdf"

        async def detach_volume(self, volume: Volume, instance: Any) -> None:
            return None

    assert not supports(LocalProvider, ProviderWithVolumes)
    assert not supports(LocalProvider, ProviderWithGateways)
    assert supports(WithVolumes, CAPABILITY_OF_KIND["volume"])
    assert supports(WithVolumes(), ProviderWithVolumes)
    assert not supports(WithVolumes, CAPABILITY_OF_KIND["gateway"])
    # the base has no stubs: a provider without the mixin has no such methods at all
    assert not hasattr(LocalProvider, "create_volume")
    assert not hasattr(LocalProvider, "create_gateway")
    assert Gateway(provider="aws", id="g", name="main", region="r").hostname is None


ENTRY_POINTS = """[dstack_plan.providers]
local = third_party_local:ThirdPartyLocal
"""
MODULE = """from dstack_plan.providers.local import LocalProvider


class ThirdPartyLocal(LocalProvider):
    pass
"""


@pytest.fixture
def third_party_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An installed distribution (a dist-info on sys.path) registering its own `local`."""
    site = tmp_path / "site"
    dist = site / "third_party_local-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: third-party-local\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    (site / "third_party_local.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(site))
    yield
    sys.modules.pop("third_party_local", None)


def test_project_finds_its_local_provider_through_the_registry(
    tmp_path: Path, third_party_local: None
) -> None:
    project = Project(tmp_path, state_path=tmp_path / "s.json", agent_dir=tmp_path / "a")
    assert type(project.local).__name__ == "ThirdPartyLocal"
    assert project.machines.implicit is project.local
    assert project.local.agent_dir == tmp_path / "a"
