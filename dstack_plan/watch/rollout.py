"""Replaces a service's replicas one at a time after its spec changed (rolling update).

(Placeholder: being written.)
"""

from __future__ import annotations

from dstack_plan.watch.tick import Acted, Tick


class Rollout:
    name = "rollout"

    async def act(self, tick: Tick) -> Acted:
        return Acted()
