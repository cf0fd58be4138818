"""What a Kubernetes fleet's state entry records: the cluster (kubeconfig path, context,
namespace) and its node groups as they were last read.

A Kubernetes fleet (`backends: [kubernetes]`) is capacity on a cluster, not machines: there is
nothing to create or terminate. Its entry holds what a run needs to reach the cluster without
the backends file (a destroy after the file changed): the cluster's settings, never a
credential (the kubeconfig stays where it is, named by its path).
"""

from __future__ import annotations

from dstack_plan.config.kubernetes_backend import KubernetesCluster
from dstack_plan.fleets.engine_records import EngineFleetRecord
from dstack_plan.providers.kubernetes.nodes import NodeGroup
from dstack_plan.state.identity_memo import IdentityMemo
from dstack_plan.state.model import ResourceState


class KubernetesFleetRecord(EngineFleetRecord):
    """The attributes of a Kubernetes fleet's state entry."""

    cluster: KubernetesCluster
    node_groups: tuple[NodeGroup, ...] = ()

    @classmethod
    def of(cls, entry: ResourceState) -> KubernetesFleetRecord:
        """The record `entry` holds (read once per entry object)."""
        return _RECORDS.get_or_make(entry, lambda e: cls.model_validate(e.attributes))


_RECORDS: IdentityMemo[ResourceState, KubernetesFleetRecord] = IdentityMemo()
