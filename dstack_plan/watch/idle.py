"""Releases cloud instances idle longer than the fleet's idle_duration, never below nodes.min.

(Placeholder: being written.)
"""

from __future__ import annotations

from dstack_plan.watch.tick import Acted, Tick


class IdleFleets:
    name = "idle"

    async def act(self, tick: Tick) -> Acted:
        return Acted()
