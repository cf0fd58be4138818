"""The engine reaching an engine fleet's cluster (Slurm, Kubernetes), from its state entry.

`FleetMachines` keeps one per fleet for a command and makes it anew when what reaching the
cluster depends on changed (`identity`); each backend's fleet module builds its own
(`fleets/slurm.py`, `fleets/kubernetes.py`).
"""

from __future__ import annotations

import json

from dstack_plan.apply.handlers import ResourceHandler
from dstack_plan.errors import ProviderError
from dstack_plan.providers.engine import ClusterEngine, EngineOf
from dstack_plan.state.model import ResourceState


def identity(entry: ResourceState) -> str:
    """What reaching engine fleet `entry`'s cluster depends on (its recorded cluster
    settings, and pins where it has them), as one string to compare."""
    reach = {k: v for k, v in entry.attributes.items() if k in ("cluster", "pins")}
    return json.dumps([entry.provider, reach], sort_keys=True, default=str)


def make_engine(entry: ResourceState) -> ClusterEngine:
    """An engine reaching engine fleet `entry`'s cluster as recorded (no I/O yet)."""
    if entry.provider == "slurm":
        from dstack_plan.fleets.slurm import engine_for
        from dstack_plan.fleets.slurm_records import SlurmFleetRecord

        return engine_for(SlurmFleetRecord.of(entry))
    if entry.provider == "kubernetes":
        from dstack_plan.fleets.kubernetes import kube_engine_for
        from dstack_plan.fleets.kubernetes_records import KubernetesFleetRecord

        return kube_engine_for(KubernetesFleetRecord.of(entry))
    raise ProviderError("fleet", f"{entry.address} ({entry.provider}) is not an engine fleet")


def fleet_handler(provider: str, kept: EngineOf) -> ResourceHandler:
    """The fleet handler of engine backend `provider`, reaching clusters through `kept`."""
    if provider == "slurm":
        from dstack_plan.fleets.slurm import SlurmFleetHandler

        return SlurmFleetHandler(kept)
    if provider == "kubernetes":
        from dstack_plan.fleets.kubernetes import KubernetesFleetHandler

        return KubernetesFleetHandler(kept)
    raise ProviderError("fleet", f"{provider!r} is not an engine backend")
