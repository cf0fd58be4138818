"""What runs on every engine fleet (Slurm, Kubernetes) share: what no engine takes yet, and
the cluster as the one machine their jobs record.

Each engine's own module (`runs/slurm_runs.py`, `runs/kubernetes_runs.py`) adds what only it
refuses (Slurm: an image on a cluster without containers) and how its runs are placed.
"""

from __future__ import annotations

from dstack_plan.config.runs import DevEnvironmentSpec, RunSpec, ServiceSpec, TaskSpec
from dstack_plan.fleets.machines import Machine
from dstack_plan.providers.base import Instance
from dstack_plan.runs.jobs import run_kind


def not_yet(
    spec: RunSpec, title: str, files_hint: str, volumes_hint: str | None = None
) -> str | None:
    """Why a `title` fleet (`Slurm`, `Kubernetes`) cannot run `spec` in this version; None
    when it can. The hints say what to do instead of `files:` and `volumes:` (None: the
    engine mounts volumes)."""
    if isinstance(spec, DevEnvironmentSpec):
        return f"{run_kind(spec)}s cannot run on a {title} fleet yet (tasks and services can)"
    if spec.files or spec.repos:
        return f"files: and repos: are not sent to {title} clusters yet ({files_hint})"
    if spec.volumes and volumes_hint is not None:
        return f"volumes: are not mounted on {title} clusters yet ({volumes_hint})"
    if isinstance(spec, TaskSpec | ServiceSpec) and spec.groups:
        return f"groups cannot run on a {title} fleet yet (one shape for every node or replica)"
    return None


def cluster_machine(fleet: str, provider: str, cluster: str, hostname: str) -> Machine:
    """Cluster `cluster` as the one "machine" an engine fleet's jobs record (`JobRecord.host`
    is the cluster's name)."""
    instance = Instance(
        provider=provider,
        id=cluster,
        name=cluster,
        fleet=fleet,
        hostname=hostname,
        region=cluster,
    )
    return Machine(
        fleet=fleet, provider=provider, host=cluster, address=cluster, instance=instance
    )
