"""Attaching a run's network volumes to the machines its jobs go to, and detaching them
from machines where no job uses them any more.

Before a job that mounts a volume is submitted, the volume is attached to the job's cloud
machine (idempotent: one attached there already stays) and the job is told where the disk
may appear (`ProviderWithVolumes.device_paths`); the agent formats a blank disk and Docker
mounts it (`agent/disks.py`). A volume attached to a machine where no unfinished job mounts
it is detached: when a run is destroyed or replaced, and by watch once a job ends
(`watch/volume_release.py`). A machine whose volumes cannot be told (another provider's,
not in state) keeps them: nothing is detached under a job that may be using it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from dstack_plan.agent.api_models import DiskMount
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.cloud_records import CloudFleetRecord, CloudInstance
from dstack_plan.fleets.records import is_cloud_fleet
from dstack_plan.providers.capabilities import ProviderWithVolumes, Volume
from dstack_plan.runs.volume_mounts import job_volumes, volumes_in_use
from dstack_plan.volumes.records import volume_of

if TYPE_CHECKING:
    from dstack_plan.providers.configured import ConfiguredClouds
    from dstack_plan.runs.jobs import JobSlot
    from dstack_plan.runs.submission import PlacedJob
    from dstack_plan.state.model import State

log = logging.getLogger(__name__)

DETACH_TIMEOUT_S = 120.0


class Detached(NamedTuple):
    address: str
    """The volume's state address."""
    volume: Volume
    """The volume as its provider shows it after the detach."""
    instance: str
    """The machine it was detached from (the provider's id)."""


class VolumeAttacher:
    """Attaches and detaches network volumes on the backends `.dstack/backends.yml` holds."""

    def __init__(self, clouds: ConfiguredClouds):
        self._clouds = clouds

    async def attach(
        self,
        spec: RunSpec,
        placed: Sequence[PlacedJob],
        state: State,
        progress: Callable[[str], None],
    ) -> dict[JobSlot, list[DiskMount]]:
        """Attach the volumes each placed job mounts to its machine; the disks each job's
        agent mounts, by slot. ProviderError when a volume is not in state or cannot be
        attached there (another zone, attached to another machine)."""
        disks: dict[JobSlot, list[DiskMount]] = {}
        for job in placed:
            wanted = job_volumes(spec, job.slot.node)
            if not wanted:
                continue
            instance = cloud_instance(state, job.machine.fleet, job.machine.host)
            if instance is None:
                raise ProviderError(
                    job.machine.provider,
                    f"{job.machine.host} is not a cloud machine: network volumes attach only "
                    "to machines of their backend",
                    job.machine.host,
                )
            mounts = []
            for mounted in wanted:
                volume = _recorded(state, mounted.name)
                provider = self._provider(volume.provider, state)
                progress(f"attaching volume {mounted.name} ({volume.id}) to {instance.id}")
                device = await provider.attach_volume(
                    volume, instance.as_instance(job.machine.fleet)
                )
                devices = provider.device_paths(volume, device)
                mounts.append(
                    DiskMount(
                        name=mounted.name, devices=list(devices), container_path=mounted.path
                    )
                )
            disks[job.slot] = mounts
        return disks

    async def release(
        self, state: State, excluding: Iterable[str] = (), *, refreshed: bool = False
    ) -> list[Detached]:
        """Detach every volume of `state` from the machines where no unfinished job of its
        runs (but those at `excluding` addresses, being removed) mounts it, and wait until
        it is. `refreshed`: the state's volume entries show the providers' view now (a
        watch tick's); otherwise each volume is read again first. A volume whose provider
        cannot answer is left as it is (logged)."""
        used = volumes_in_use(state, excluding)
        machines = _cloud_machines(state)
        done: list[Detached] = []
        for entry in sorted(state.resources.values(), key=lambda e: e.address):
            volume = volume_of(entry) if entry.kind == "volume" else None
            if volume is None:
                continue
            try:
                provider = self._provider(volume.provider, state)
                if not refreshed:
                    found = await provider.refresh_volumes([volume])
                    if not found:
                        continue
                    volume = found[0]
                for instance_id in volume.attached_to:
                    machine = machines.get(instance_id)
                    if machine is None or (entry.name, machine[0], machine[1].hostname) in used:
                        continue  # not one of ours, or a job still mounts it there
                    volume = await self._detach(provider, volume, *machine)
                    done.append(Detached(entry.address, volume, instance_id))
            except ProviderError as e:
                log.warning("%s: cannot detach: %s", entry.address, e.detail)
        return done

    async def _detach(
        self, provider: ProviderWithVolumes, volume: Volume, fleet: str, instance: CloudInstance
    ) -> Volume:
        await provider.detach_volume(volume, instance.as_instance(fleet))
        await provider.wait_for_volume(
            volume,
            lambda v: instance.id not in v.attached_to,
            f"detached from {instance.id}",
            timeout=DETACH_TIMEOUT_S,
        )
        found = await provider.refresh_volumes([volume])
        return found[0] if found else volume

    def _provider(self, backend: str, state: State) -> ProviderWithVolumes:
        provider = self._clouds.provider(backend, state.lineage, creating=False)
        if not isinstance(provider, ProviderWithVolumes):
            raise ProviderError(backend, "this provider cannot hold volumes")
        return provider


def cloud_instance(state: State, fleet: str, host: str) -> CloudInstance | None:
    """The cloud machine `host` of `fleet`; None when the fleet is no cloud fleet."""
    entry = state.get(f"fleet.{fleet}")
    if entry is None or not is_cloud_fleet(entry):
        return None
    return next((i for i in CloudFleetRecord.of(entry).instances if i.hostname == host), None)


def _cloud_machines(state: State) -> dict[str, tuple[str, CloudInstance]]:
    """Every machine of the state's cloud fleets by its provider id: (fleet, machine)."""
    found: dict[str, tuple[str, CloudInstance]] = {}
    for entry in state.resources.values():
        if entry.kind == "fleet" and is_cloud_fleet(entry):
            for instance in CloudFleetRecord.of(entry).instances:
                found[instance.id] = (entry.name, instance)
    return found


def _recorded(state: State, name: str) -> Volume:
    entry = state.get(f"volume.{name}")
    volume = volume_of(entry) if entry is not None else None
    if volume is None:
        raise ProviderError("volume", f"volume {name} is not in state: apply it first")
    if volume.status != "active":
        raise ProviderError(volume.provider, f"volume {name} is {volume.status}, not active")
    return volume
