"""Stops running jobs that crossed a limit watch enforces (inactivity_duration,
utilization_policy; see watch/limits.py).

(Placeholder: being written.)
"""

from __future__ import annotations

from dstack_plan.watch.tick import Acted, Tick


class LimitEnforcer:
    name = "limits"

    async def act(self, tick: Tick) -> Acted:
        return Acted()
