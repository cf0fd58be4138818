"""Kubernetes fleets (`backends: [kubernetes]`): capacity on a cluster the team already runs.

A create reads the namespace (that the kubeconfig's credentials reach it) and the nodes,
grouped by GPU model (`providers/kubernetes/nodes.py`), and records both with the cluster's
settings; it creates nothing. A refresh reads the nodes again (an API server that does not
answer makes the fleet `unreachable`, never an error: its pods may run on). A delete has
nothing to terminate: the runs on the fleet are deleted before it (their objects with them).

Which cluster: the fleet's first `regions:` entry names it (each cluster is a region, as in
dstack), else the backend's first cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.config.kubernetes_backend import KubernetesBackend, KubernetesCluster
from dstack_plan.errors import DstackPlanError, ProviderError
from dstack_plan.fleets.kubernetes_records import KubernetesFleetRecord
from dstack_plan.plan.model import ResourceChange
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.engine import EngineOf
from dstack_plan.providers.kubernetes.engine import KubernetesEngine
from dstack_plan.providers.names import KUBERNETES
from dstack_plan.state.model import ResourceState


def cluster_for(spec: Mapping[str, Any], project_dir: str) -> KubernetesCluster:
    """The cluster a Kubernetes fleet's normalised `spec` goes to (see the module doc);
    ProviderError when the backends file has no such cluster."""
    from dstack_plan.config.backends import backend_config

    backend = backend_config(project_dir, KUBERNETES)
    if not isinstance(backend, KubernetesBackend):
        raise ProviderError(
            KUBERNETES,
            "the kubernetes backend is not configured in .dstack/backends.yml "
            "(docs/kubernetes.md)",
        )
    regions = spec.get("regions") or []
    wanted = str(regions[0]) if regions else None
    cluster = backend.cluster(wanted)
    if cluster is None:
        names = ", ".join(c.name for c in backend.clusters)
        raise ProviderError(
            KUBERNETES, f"no Kubernetes cluster named {wanted!r} (the backend has {names})"
        )
    return cluster


def kube_engine_for(record: KubernetesFleetRecord) -> KubernetesEngine:
    """An engine reaching `record`'s cluster (no I/O yet)."""
    return KubernetesEngine(record.cluster)


class KubernetesFleetHandler(ResourceHandler):
    """Fleets of the `kubernetes` backend."""

    def __init__(self, kept: EngineOf):
        self._kept = kept

    def cannot_create(self, kind: str, provider: str) -> str | None:
        return None if provider == KUBERNETES else f"not a {KUBERNETES} fleet"

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        assert change.after is not None
        _check_spec(change.after)
        cluster = cluster_for(change.after, ctx.project_dir)
        engine = KubernetesEngine(cluster)
        ctx.progress(change.address, f"reading the nodes of {cluster.name}")
        try:
            await engine.check_namespace()
            groups = await engine.node_groups()
        finally:
            await engine.close()
        if not groups:
            raise ProviderError(KUBERNETES, f"cluster {cluster.name} has no nodes")
        record = KubernetesFleetRecord(cluster=cluster, node_groups=tuple(groups))
        return Outcome(status=record.status, attributes=record.to_attributes())

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        return await self.create(change, ctx)

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        record = KubernetesFleetRecord.of(current)
        engine = self._kept(current)
        assert isinstance(engine, KubernetesEngine)
        try:
            groups = await engine.node_groups()
        except DstackPlanError as e:
            changed = record.model_copy(update={"problem": str(e)})
            return Refreshed(changed.status, changed.to_attributes())
        fresh = record.model_copy(update={"node_groups": tuple(groups), "problem": None})
        return Refreshed(fresh.status, fresh.to_attributes())

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        """Nothing to terminate: the cluster is the team's, and the fleet's runs were
        deleted before it (their objects with them)."""


def _check_spec(spec: Mapping[str, Any]) -> None:
    from dstack_plan.config.fleet import FleetSpec

    fleet = spec_from_normalized("fleet", dict(spec))
    assert isinstance(fleet, FleetSpec)
    if fleet.ssh_config is not None:
        raise ProviderError(KUBERNETES, "a Kubernetes fleet has no ssh_config")
