"""`type: volume` with `backend: kubernetes`: a PersistentVolumeClaim runs on a Kubernetes
fleet mount.

With `size:` a claim `dp-<name>` is created in the cluster's namespace (`storage_class_name`
and `access_modes` as given, else the cluster's default class and ReadWriteOnce); with
`claim_name:` an existing claim is registered (and only ever forgotten). The claim is usable
once created: a storage class that binds on first use (`WaitForFirstConsumer`) binds when the
first pod mounts it. The entry records the cluster (the backend's first: a volume has no
region) so a destroy reaches it without the backends file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.config.kubernetes_backend import KubernetesCluster
from dstack_plan.errors import ProviderError
from dstack_plan.providers.capabilities import Volume
from dstack_plan.providers.names import KUBERNETES
from dstack_plan.volumes.records import volume_of, volume_spec

if TYPE_CHECKING:
    from dstack_plan.config.volume import VolumeSpec
    from dstack_plan.plan.model import ResourceChange
    from dstack_plan.providers.kubernetes.engine import KubernetesEngine
    from dstack_plan.state.model import ResourceState

CLAIM_PREFIX = "dp-"
"""Created claims are `dp-<volume name>`: apart from the team's own."""


def _cluster(project_dir: str) -> KubernetesCluster:
    """The backend's first cluster (a volume has no region)."""
    from dstack_plan.fleets.kubernetes import cluster_for

    return cluster_for({}, project_dir)


def _engine(cluster: KubernetesCluster) -> KubernetesEngine:
    from dstack_plan.providers.kubernetes.engine import KubernetesEngine

    return KubernetesEngine(cluster)


class KubernetesVolumes(ResourceHandler):
    """PersistentVolumeClaims in a Kubernetes cluster's namespace."""

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        assert change.after is not None
        spec = volume_spec(change.after)
        cluster = _cluster(ctx.project_dir)
        engine = _engine(cluster)
        try:
            if spec.claim_name:
                claim = await engine.read_claim(spec.claim_name)
            else:
                claim = await engine.create_claim(_claim(spec, change.name))
        finally:
            await engine.close()
        volume = _volume(change.name, cluster, claim, external=bool(spec.claim_name))
        verb = "registered" if volume.external else "created"
        ctx.progress(change.address, f"{verb} PersistentVolumeClaim {volume.id}")
        return Outcome(volume.status, _attributes(volume, cluster))

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        """Nothing changes in place (size and class changes replace the claim)."""
        refreshed = await self.refresh(current, ctx)
        if refreshed.gone is not None:
            raise ProviderError(KUBERNETES, refreshed.gone, current.address)
        return Outcome(refreshed.status, refreshed.attributes)

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        """The claim as the cluster has it; the entry as it is when the cluster does not
        answer."""
        kept = Refreshed(current.status, dict(current.attributes))
        volume = volume_of(current)
        if volume is None:
            return kept
        cluster = KubernetesCluster.model_validate(current.attributes["cluster"])
        engine = _engine(cluster)
        try:
            claim = await engine.read_claim(volume.id, missing_ok=True)
        except ProviderError:
            return kept
        finally:
            await engine.close()
        if claim is None:
            return Refreshed(
                current.status, dict(current.attributes), gone=f"claim {volume.id} is gone"
            )
        fresh = _volume(volume.name, cluster, claim, external=volume.external)
        return Refreshed(fresh.status, {**current.attributes, **_attributes(fresh, cluster)})

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        volume = volume_of(current)
        if volume is None or volume.external:  # a registered claim is only forgotten
            return
        cluster = KubernetesCluster.model_validate(current.attributes["cluster"])
        engine = _engine(cluster)
        try:
            await engine.delete_claim(volume.id)
        finally:
            await engine.close()


def _claim(spec: VolumeSpec, volume: str) -> Any:
    from kubernetes import client as k8s

    from dstack_plan.providers.kubernetes.manifests import labels

    name = f"{CLAIM_PREFIX}{volume}"
    return k8s.V1PersistentVolumeClaim(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels(name, volume)),
        spec=k8s.V1PersistentVolumeClaimSpec(
            access_modes=list(spec.access_modes or ("ReadWriteOnce",)),
            storage_class_name=spec.storage_class_name,
            resources=k8s.V1VolumeResourceRequirements(
                requests={"storage": f"{int(spec.size or 0)}Gi"}
            ),
        ),
    )


def _volume(name: str, cluster: KubernetesCluster, claim: Any, external: bool) -> Volume:
    phase = getattr(claim.status, "phase", None)
    asked = (claim.spec.resources.requests or {}).get("storage") if claim.spec.resources else None
    from dstack_plan.providers.kubernetes.nodes import parse_quantity

    return Volume(
        provider=KUBERNETES,
        id=claim.metadata.name,
        name=name,
        region=cluster.name,
        size_gb=parse_quantity(asked) / 1024**3 if asked else None,
        external=external,
        status="failed" if phase == "Lost" else "active",
    )


def _attributes(volume: Volume, cluster: KubernetesCluster) -> dict[str, Any]:
    return {**volume.model_dump(mode="json"), "cluster": cluster.model_dump(mode="json")}
