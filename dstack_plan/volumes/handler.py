"""`type: volume`: network disks on a cloud backend, created or registered, and deleted
(PersistentVolumeClaims on a Kubernetes cluster: `volumes/kubernetes.py`).

A volume's state entry holds the provider's `Volume` (id, zone, size, whether it was
registered by `volume_id`). Creating waits until the disk is usable; deleting detaches it
first and waits until it is gone; a registered volume is only forgotten. Volumes keep
`lifecycle.prevent_destroy` unless the configuration says otherwise (`plan/kinds.py`): the
plan refuses to destroy one before any of this runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dstack_plan.apply.handlers import ApplyContext, Outcome, Refreshed, ResourceHandler
from dstack_plan.errors import ProviderError
from dstack_plan.providers.capabilities import ProviderWithVolumes, Volume, supports
from dstack_plan.providers.names import CLOUDS, KUBERNETES
from dstack_plan.providers.registry import provider_class
from dstack_plan.volumes.records import volume_of, volume_spec

if TYPE_CHECKING:
    from dstack_plan.plan.model import ResourceChange
    from dstack_plan.providers.configured import ConfiguredClouds
    from dstack_plan.state.model import ResourceState

READY_TIMEOUT_S = 300.0
GONE_TIMEOUT_S = 300.0


class VolumeHandler(ResourceHandler):
    """Volumes on the backends `.dstack/backends.yml` configures."""

    def __init__(self, clouds: ConfiguredClouds):
        self._clouds = clouds
        self._kubernetes: ResourceHandler | None = None

    @property
    def kubernetes(self) -> ResourceHandler:
        """PersistentVolumeClaims (`volumes/kubernetes.py`), loaded when a volume is one."""
        if self._kubernetes is None:
            from dstack_plan.volumes.kubernetes import KubernetesVolumes

            self._kubernetes = KubernetesVolumes()
        return self._kubernetes

    def cannot_create(self, kind: str, provider: str) -> str | None:
        if provider == KUBERNETES:
            return None
        if provider not in CLOUDS:
            return f"the {provider} provider cannot create volumes in this version"
        reason = self._clouds.cannot_create(provider)
        if reason is not None:
            return reason
        if not supports(provider_class(provider), ProviderWithVolumes):
            return f"the {provider} provider cannot create volumes in this version"
        return None

    def _provider(self, backend: str, ctx: ApplyContext) -> ProviderWithVolumes:
        provider = self._clouds.provider(backend, ctx.current_state().lineage, creating=False)
        if not isinstance(provider, ProviderWithVolumes):
            raise ProviderError(backend, "this provider cannot hold volumes")
        return provider

    async def create(self, change: ResourceChange, ctx: ApplyContext) -> Outcome:
        assert change.after is not None
        spec = volume_spec(change.after)
        if spec.backend == KUBERNETES:
            return await self.kubernetes.create(change, ctx)
        provider = self._provider(spec.backend, ctx)
        volume = await provider.create_volume(spec)
        ctx.progress(change.address, f"{_verb(volume)} {volume.id}")
        try:
            ready = await self._until_ready(provider, volume)
        except BaseException:
            if not volume.external:  # never leave a disk nothing records
                await provider.delete_volume(volume)
            raise
        return Outcome("active", ready.model_dump(mode="json"))

    async def update(
        self, change: ResourceChange, current: ResourceState, ctx: ApplyContext
    ) -> Outcome:
        """Nothing physical changes in place (size and zone changes replace the volume)."""
        if current.provider == KUBERNETES:
            return await self.kubernetes.update(change, current, ctx)
        refreshed = await self.refresh(current, ctx)
        if refreshed.gone is not None:
            raise ProviderError(current.provider, refreshed.gone, current.address)
        return Outcome(refreshed.status, refreshed.attributes)

    async def refresh(self, current: ResourceState, ctx: ApplyContext) -> Refreshed:
        """The volume as its provider sees it; the state as it is when it records no
        volume (a create cut short) or the provider cannot answer (no credentials, backend
        removed), as cloud fleets do: a plan still works, and apply would say why."""
        if current.provider == KUBERNETES:
            return await self.kubernetes.refresh(current, ctx)
        kept = Refreshed(current.status, dict(current.attributes))
        volume = volume_of(current)
        if volume is None:
            return kept
        try:
            found = await self._provider(volume.provider, ctx).refresh_volumes([volume])
        except ProviderError:
            return kept
        if not found:
            return Refreshed(
                current.status, dict(current.attributes), gone=f"volume {volume.id} is gone"
            )
        # what watch noted beside the provider's view stays (`watch/volume_cleanup.py`)
        return Refreshed(
            found[0].status, {**current.attributes, **found[0].model_dump(mode="json")}
        )

    async def delete(self, current: ResourceState, ctx: ApplyContext) -> None:
        if current.provider == KUBERNETES:
            return await self.kubernetes.delete(current, ctx)
        volume = volume_of(current)
        if volume is None:  # a create cut short before the provider answered
            return
        provider = self._provider(volume.provider, ctx)
        await provider.delete_volume(volume)
        if volume.external:
            return
        await provider.wait_for_volume(volume, lambda _: False, "deleted", timeout=GONE_TIMEOUT_S)

    async def _until_ready(self, provider: ProviderWithVolumes, volume: Volume) -> Volume:
        settled = ("active", "failed")
        await provider.wait_for_volume(
            volume, lambda v: v.status in settled, "ready", timeout=READY_TIMEOUT_S
        )
        found = await provider.refresh_volumes([volume])
        if not found or found[0].status != "active":
            raise ProviderError(volume.provider, f"volume {volume.id} failed to create")
        return found[0]


def _verb(volume: Volume) -> str:
    return "registered" if volume.external else "created"
