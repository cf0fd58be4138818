"""Marks hosts unreachable after consecutive failed checks and fails their jobs with
instance_unreachable after a grace period.

(Placeholder: being written.)
"""

from __future__ import annotations

from dstack_plan.watch.tick import Acted, Tick


class Reachability:
    name = "reachability"

    async def act(self, tick: Tick) -> Acted:
        return Acted()
