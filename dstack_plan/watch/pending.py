"""Places queued runs (no capacity at apply) when room frees up, and starts scheduled runs when
their cron fires.

(Placeholder: being written.)
"""

from __future__ import annotations

from dstack_plan.watch.tick import Acted, Tick


class PendingRuns:
    name = "pending"

    async def act(self, tick: Tick) -> Acted:
        return Acted()
