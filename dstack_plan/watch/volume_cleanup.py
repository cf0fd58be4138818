"""`auto_cleanup_duration`: a volume no job has mounted for that long is deleted.

Watch notes in the volume's state entry when it first saw the volume unused (`unused_since`:
attached nowhere and mounted by no unfinished job of the project's runs), so a restarted
watch carries on, and clears the note when a job uses it again. Past the duration it deletes
the volume at its provider; the next plan finds it gone and creates it again if the
configuration still declares it. A registered volume (`volume_id`) is never deleted, and
`off` (or no duration) keeps a volume forever, as dstack does.
"""

from __future__ import annotations

import logging

from dstack_plan.errors import DstackPlanError
from dstack_plan.providers.capabilities import ProviderWithVolumes
from dstack_plan.runs.volume_mounts import volumes_in_use
from dstack_plan.state.model import ResourceState
from dstack_plan.volumes.records import volume_of
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)

UNUSED_SINCE = "unused_since"
"""The state attribute: when watch first saw the volume unused (epoch seconds)."""
CLEANED_UP = "cleaned_up_at"
"""The state attribute: when watch deleted the volume for `auto_cleanup_duration`."""


class VolumeCleanup:
    """Deletes volumes unused past their `auto_cleanup_duration` (see the module doc)."""

    name = "volume-cleanup"

    async def act(self, tick: Tick) -> Acted:
        acted = Acted()
        volumes = [e for e in tick.state.resources.values() if e.kind == "volume"]
        if not volumes:
            return acted
        used = {name for name, _, _ in volumes_in_use(tick.state)}
        for entry in volumes:
            try:
                changed = await self._volume(tick, entry, entry.name in used)
            except DstackPlanError as e:
                log.warning("%s: cannot clean up: %s", entry.address, e)
                continue
            if changed is not None:
                acted.changed[entry.address] = changed
        return acted

    async def _volume(self, tick: Tick, entry: ResourceState, used: bool) -> ResourceState | None:
        limit = _limit(entry)
        volume = volume_of(entry)
        if limit is None or volume is None or volume.external or CLEANED_UP in entry.attributes:
            return None
        since = entry.attributes.get(UNUSED_SINCE)  # refresh keeps watch's notes
        if used or volume.attached_to:
            return None if since is None else _noted(entry, {UNUSED_SINCE: None})
        if not isinstance(since, (int, float)):
            return _noted(entry, {UNUSED_SINCE: tick.now})
        if tick.now - since < limit:
            return None
        provider = tick.project.clouds.provider(
            volume.provider, tick.state.lineage, creating=False
        )
        if not isinstance(provider, ProviderWithVolumes):
            return None
        await provider.delete_volume(volume)
        log.info("%s: deleted %s, unused for %.0fs (auto_cleanup_duration)", entry.address,
                 volume.id, tick.now - since, extra={"event": "volume_cleaned_up",
                 "address": entry.address, "resource_type": "volume"})  # fmt: skip
        return _noted(entry, {UNUSED_SINCE: since, CLEANED_UP: tick.now})


def _limit(entry: ResourceState) -> int | None:
    """The volume's `auto_cleanup_duration` in seconds; None: kept forever."""
    raw = entry.spec.get("auto_cleanup_duration")
    if raw is None or raw == "off":
        return None
    from dstack_plan.config.units import parse_idle_duration

    seconds = parse_idle_duration(raw)
    return seconds if isinstance(seconds, int) and seconds >= 0 else None


def _noted(entry: ResourceState, notes: dict[str, object]) -> ResourceState:
    attributes = {**entry.attributes, **notes}
    if attributes.get(UNUSED_SINCE) is None:
        attributes.pop(UNUSED_SINCE, None)
    return entry.updated(now=entry.updated_at, attributes=attributes)
