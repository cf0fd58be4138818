"""Network volumes in runs, as state and configuration know them: which volume each job of a
run mounts, where the machine of such a job must be, and which volumes jobs use now. Pure.

A volume attaches only to a machine of its backend in its zone (`availability_zone`, or the
zone it was created in), so a run that mounts one is placed on a cloud fleet of that backend,
on a machine labelled with that `zone`; anywhere else it cannot run. A volume is in use on a
machine while a job that mounts it has not finished there: watch detaches it otherwise
(`watch/volume_release.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from dstack_plan.config import interpolation
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.config.run_fields import NetworkVolumeMount
from dstack_plan.config.runs import RunSpec
from dstack_plan.plan.kinds import FINISHED_STATUSES
from dstack_plan.volumes.records import volume_of

if TYPE_CHECKING:
    from dstack_plan.config.volume import VolumeSpec
    from dstack_plan.state.model import State


class VolumeSite(NamedTuple):
    """Where a volume lives: the machines that may mount it are there."""

    provider: str
    zone: str | None
    """None while not known (created by this plan without an `availability_zone`)."""


class JobVolume(NamedTuple):
    """A network volume one job mounts."""

    name: str
    path: str
    """Where it appears in the container."""


class VolumeNeeds(NamedTuple):
    """What a run's volumes ask of the fleet it is placed on."""

    never: str | None = None
    """Why no machine of the fleet can take it; None when one may."""
    zone: str | None = None
    """The zone its machine must be in; None: any."""


def job_volumes(spec: RunSpec, node: int) -> list[JobVolume]:
    """The network volumes the job of node `node` mounts: a list of names gives one per
    node, and `${{ dstack.node_rank }}` in a name is the node's rank."""
    found = []
    for mount in spec.volumes:
        if not isinstance(mount, NetworkVolumeMount):
            continue
        names = (mount.name,) if isinstance(mount.name, str) else mount.name
        name = names[node] if node < len(names) else names[-1]
        found.append(JobVolume(_node_name(name, node), mount.path))
    return found


def run_volume_names(spec: RunSpec) -> list[str]:
    """Every network volume some job of the run mounts, in configuration order."""
    from dstack_plan.runs.jobs import slots

    names: dict[str, None] = {}
    for slot in slots(spec):
        names.update((v.name, None) for v in job_volumes(spec, slot.node))
    return list(names)


def volume_sites(state: State, declared: Iterable[VolumeSpec] = ()) -> dict[str, VolumeSite]:
    """Where each volume is, by name: as state records it, else as its configuration says."""
    sites = {
        spec.name: VolumeSite(spec.backend, spec.availability_zone)
        for spec in declared
        if spec.name
    }
    for entry in state.resources.values():
        if entry.kind == "volume" and (volume := volume_of(entry)) is not None:
            sites[entry.name] = VolumeSite(volume.provider, volume.zone)
    return sites


def volume_needs(
    spec: RunSpec, fleet: str, provider: str, sites: Mapping[str, VolumeSite]
) -> VolumeNeeds:
    """What the network volumes of `spec` ask of fleet `fleet` (of `provider`)."""
    zones: set[str] = set()
    for name in run_volume_names(spec):
        site = sites.get(name)
        if site is None:
            return VolumeNeeds(f"it mounts the volume {name}, which no configuration declares")
        if site.provider != provider:
            return VolumeNeeds(
                f"it mounts the {site.provider} volume {name}, which attaches only to "
                f"{site.provider} machines, and fleet {fleet} is {_kind(provider)}"
            )
        if site.zone is not None:
            zones.add(site.zone)
    if len(zones) > 1:
        return VolumeNeeds(
            f"its volumes are in different zones ({', '.join(sorted(zones))}): one machine "
            "cannot attach them all"
        )
    return VolumeNeeds(zone=next(iter(zones), None))


def volumes_in_use(state: State, excluding: Iterable[str] = ()) -> set[tuple[str, str, str]]:
    """(volume, fleet, host) for every job of the state's runs (but those at `excluding`
    addresses) that mounts a network volume and has not finished."""
    from dstack_plan.plan.normalize import spec_from_normalized
    from dstack_plan.runs.records import RunRecord

    skipped = set(excluding)
    used: set[tuple[str, str, str]] = set()
    for entry in state.resources.values():
        if entry.kind not in RUN_KINDS or entry.address in skipped:
            continue
        if not entry.spec.get("volumes"):
            continue
        spec = spec_from_normalized(entry.kind, dict(entry.spec))
        assert isinstance(spec, RunSpec)
        record = RunRecord.of(entry)
        for job in record.jobs:
            if job.status in FINISHED_STATUSES:
                continue
            used.update((v.name, record.fleet, job.host) for v in job_volumes(spec, job.node))
    return used


def _node_name(name: str, node: int) -> str:
    """`name` with `${{ dstack.node_rank }}` (a task's job is its node) resolved."""
    rank = str(node)
    try:
        return interpolation.resolve(name, {"dstack": {"node_rank": rank, "job_num": rank}})
    except KeyError:  # another reference: the name as written (it names no volume)
        return name


def _kind(provider: str) -> str:
    return {"ssh": "an SSH fleet", "local": "this machine"}.get(provider, f"a {provider} fleet")
