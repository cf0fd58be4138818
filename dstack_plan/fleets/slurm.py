"""Slurm fleets (`backends: [slurm]`): capacity on a cluster the team already runs.

A create reaches the cluster's login node (pinning its host key), reads the partitions the
backend config lets runs use, and records both with the cluster's settings; it creates
nothing. A refresh reads the partitions again (a login node that does not answer makes the
fleet `unreachable`, never an error: its jobs may run on). A delete has nothing to terminate:
the runs on the fleet are deleted before it (their Slurm jobs cancelled), as on every fleet.

Which cluster: the fleet's first `regions:` entry names it (dstack makes each cluster a
region), else the backend's first cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.config.slurm_backend import SlurmBackend, SlurmCluster
from dstack_plan.errors import DstackPlanError, ProviderError
from dstack_plan.fleets.slurm_records import SlurmFleetRecord
from dstack_plan.plan.model import ResourceChange
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.engine import EngineOf
from dstack_plan.providers.names import SLURM
from dstack_plan.providers.slurm.engine import SlurmEngine
from dstack_plan.providers.slurm.login import LoginNode
from dstack_plan.providers.ssh.pins import MemoryHostKeyStore
from dstack_plan.state.model import ResourceState


def backend_of(project_dir: str) -> SlurmBackend | None:
    """The project's `type: slurm` backend; None when it has none."""
    from dstack_plan.config.backends import backend_config

    backend = backend_config(project_dir, SLURM)
    return backend if isinstance(backend, SlurmBackend) else None


def cluster_for(spec: Mapping[str, Any], project_dir: str) -> SlurmCluster:
    """The cluster a Slurm fleet's normalised `spec` goes to (see the module doc);
    ProviderError when the backends file has no such cluster."""
    backend = backend_of(project_dir)
    if backend is None:
        raise ProviderError(
            SLURM, "the slurm backend is not configured in .dstack/backends.yml (docs/slurm.md)"
        )
    regions = spec.get("regions") or []
    wanted = str(regions[0]) if regions else None
    cluster = backend.cluster(wanted)
    if cluster is None:
        names = ", ".join(c.name for c in backend.clusters)
        raise ProviderError(SLURM, f"no Slurm cluster named {wanted!r} (the backend has {names})")
    return cluster


def engine_for(record: SlurmFleetRecord) -> SlurmEngine:
    """An engine reaching `record`'s cluster with its recorded pins (no I/O yet)."""
    return SlurmEngine(LoginNode(record.cluster, MemoryHostKeyStore(dict(record.pins))))


def pins_of(engine: SlurmEngine) -> dict[str, str]:
    """The host keys `engine`'s login node is pinned to now (first use included)."""
    store = engine.login.pins
    return dict(store.pins) if isinstance(store, MemoryHostKeyStore) else {}


class SlurmFleetHandler(ResourceHandler):
    """Fleets of the `slurm` backend."""

    def __init__(self, kept: EngineOf):
        self._kept = kept

    def cannot_create(self, kind: str, provider: str) -> str | None:
        return None if provider == SLURM else f"not a {SLURM} fleet"

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        assert change.after is not None
        _check_spec(change.after)
        cluster = cluster_for(change.after, ctx.project_dir)
        engine = engine_for(SlurmFleetRecord(cluster=cluster))
        ctx.progress(change.address, f"reading the partitions of {engine.name}")
        try:
            partitions = await engine.partitions()
        finally:
            await engine.close()
        _check_partitions(cluster, partitions)
        record = SlurmFleetRecord(
            cluster=cluster, pins=pins_of(engine), partitions=tuple(partitions)
        )
        return Outcome(status=record.status, attributes=record.to_attributes())

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        return await self.create(change, ctx)

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        record = SlurmFleetRecord.of(current)
        engine = self._kept(current)
        assert isinstance(engine, SlurmEngine)
        try:
            partitions = await engine.partitions()
        except DstackPlanError as e:
            changed = record.model_copy(update={"problem": str(e)})
            return Refreshed(changed.status, changed.to_attributes())
        fresh = record.model_copy(
            update={"partitions": tuple(partitions), "problem": None, "pins": pins_of(engine)}
        )
        return Refreshed(fresh.status, fresh.to_attributes())

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        """Nothing to terminate: the cluster is the team's, and the fleet's runs were
        deleted before it (their Slurm jobs with them)."""


def _check_spec(spec: Mapping[str, Any]) -> None:
    from dstack_plan.config.fleet import FleetSpec

    fleet = spec_from_normalized("fleet", dict(spec))
    assert isinstance(fleet, FleetSpec)
    if fleet.ssh_config is not None:
        raise ProviderError(SLURM, "a Slurm fleet has no ssh_config: its hosts are Slurm's")


def _check_partitions(cluster: SlurmCluster, partitions: list[Any]) -> None:
    empty = [p.name for p in partitions if p.nodes == 0]
    if empty:
        raise ProviderError(
            SLURM,
            f"cluster {cluster.name}: partition(s) {', '.join(empty)} have no nodes (check "
            "gpu_partitions / cpu_partitions in .dstack/backends.yml against `sinfo`)",
        )
