"""The rules a leading watch carries out each tick, in the order it does them.

The order matters: hosts found lost (and cloud machines found gone) fail their jobs first, so
that the gang rule, the limits and the retry policy see those failures in the same tick; the
quotas, then fair share (borrowed GPUs of exported fleets preempted for a project under its
guarantee), go before anything is placed; a
rolling update goes before the retry policy, so that a new replica that fails ends its rollout
(the old replicas serve on) rather than counting as the service's failure; queued and
scheduled runs are placed after everything that frees room (and after services are scaled to
their request rate, when watch serves them); network volumes no job mounts
any more are detached (and deleted once unused past `auto_cleanup_duration`); and idle cloud
machines are released last, once nothing placed this tick is going to them (never below
`nodes.min`; SSH hosts never).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dstack_plan.watch.enforce import LimitEnforcer
from dstack_plan.watch.fair_share import FairShare
from dstack_plan.watch.gangs import GangStops
from dstack_plan.watch.idle_machines import IdleMachines
from dstack_plan.watch.importer_quota import ImporterQuotaEnforcer
from dstack_plan.watch.interruptions import Interruptions
from dstack_plan.watch.pending import PendingRuns
from dstack_plan.watch.priority_preemption import PriorityPreemption
from dstack_plan.watch.quota import QuotaEnforcer
from dstack_plan.watch.reachability import Reachability
from dstack_plan.watch.retries import RetryPolicy
from dstack_plan.watch.rollout import Rollout
from dstack_plan.watch.tick import Actor
from dstack_plan.watch.volume_cleanup import VolumeCleanup
from dstack_plan.watch.volume_release import VolumeRelease

if TYPE_CHECKING:
    from dstack_plan.watch.serving import Serving


def default_actors(serving: Serving | None = None) -> list[Actor]:
    """A fresh set of the loop's actors (each may keep memory between ticks). With
    `serving` (watch serves services), its autoscaler goes before queued runs are placed
    (both take room) and its routing and gateway tunnels go last, to route to what this
    tick started."""
    actors: list[Actor] = [
        Reachability(),
        Interruptions(),
        GangStops(),
        LimitEnforcer(),
        QuotaEnforcer(),
        ImporterQuotaEnforcer(),
        FairShare(),
        PriorityPreemption(),
        Rollout(),
        RetryPolicy(),
        pending := PendingRuns(),
        VolumeRelease(),
        VolumeCleanup(),
        IdleMachines(),
    ]
    if serving is not None:
        actors.insert(actors.index(pending), serving.autoscaler)
        actors += [serving.routing, serving.tunnels]
    return actors
