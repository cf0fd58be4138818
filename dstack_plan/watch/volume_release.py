"""Detaching network volumes once their jobs end: a volume attached to a cloud machine where
no unfinished job of the project mounts it any more is detached, so the next run can attach
it wherever it is placed (`runs/volume_attach.py`). Its state entry records the volume as
the provider shows it afterwards."""

from __future__ import annotations

import logging

from dstack_plan.runs.volume_attach import VolumeAttacher
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)


class VolumeRelease:
    """Detaches volumes no job uses (see the module doc)."""

    name = "volumes"

    async def act(self, tick: Tick) -> Acted:
        acted = Acted()
        if not any(e.kind == "volume" for e in tick.state.resources.values()):
            return acted
        # the tick's refresh has just read every volume: no second read per volume
        attacher = VolumeAttacher(tick.project.clouds)
        for detached in await attacher.release(tick.state, refreshed=True):
            entry = acted.changed.get(detached.address) or tick.state.get(detached.address)
            if entry is None:
                continue
            attributes = {**entry.attributes, **detached.volume.model_dump(mode="json")}
            acted.changed[detached.address] = entry.updated(
                now=entry.updated_at, attributes=attributes
            )
            log.info("%s: detached from %s (no job mounts it there)", detached.address,
                     detached.instance, extra={"event": "volume_detached",
                     "address": detached.address, "resource_type": "volume"})  # fmt: skip
        return acted
