"""Submitting a run's jobs when other submissions place runs on the same hosts at the same moment.

Each project (and each watch) places runs from what the agents list. Two applies that list a
host at the same moment both see the same GPUs free and both place there; neither is wrong
from what it saw. The host's agent is the one arbiter: it admits GPUs atomically and refuses
the second job with 409 `gpus_unavailable` (`agent/jobs.py`, `agent/gpualloc.py`).

The loser of that race withdraws whatever of its run this attempt submitted (so it holds
nothing others wait for), places the run again from fresh listings, which now show the
winner's jobs, and submits again: on another host when one has room, else it raises
`NoCapacity` naming the conflict, which queues a run whose `retry` covers no-capacity and
fails any other with a one-line error (`RunHandler.create`).

Host ports are arbitrated the same way: the agent refuses a job whose host ports an unfinished
job binds (409 `ports_unavailable`), and the loser is placed again as for GPUs.

Every new job goes through this (`RunHandler.admit_jobs`): a new run's, the replicas a
service's scale-up adds, a rolling update's new replica; only this attempt's jobs are
withdrawn, never the replicas already running.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

from dstack_plan.agent.client import AgentClient
from dstack_plan.errors import AgentError
from dstack_plan.fleets.machines import Machine
from dstack_plan.runs.jobs import JobSlot, job_id, run_kind
from dstack_plan.runs.queueing import NoCapacity
from dstack_plan.runs.submission import PlacedJob, RunSubmission, Submitted

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
"""Submissions of one run (the first, then one per re-placement) before apply gives up.

A fresh placement sees the winner's jobs at once, so a second loss means yet another
submission took the room in between: the hosts are contended by many projects at once.
Bounded so an apply never loops on them; the run then waits in the queue (or fails) with the
reason, and watch places it when room frees."""
GPUS_UNAVAILABLE = "gpus_unavailable"
"""The agent's error code for a job whose GPUs are held by others at the moment of its submit
(409; 422 with the same code means the host never has them: not a race)."""
PORTS_UNAVAILABLE = "ports_unavailable"
"""The agent's error code for a job whose host ports an unfinished job binds (409)."""
CONFLICT = "GPUs taken by another submission at the same moment"
"""How a run that lost every race says why it waits (or failed)."""
MAX_CONCURRENT_WITHDRAWALS = 16
"""Jobs of one run removed at once after a lost race (a service may have many replicas)."""
BACKOFF = 0.2
"""Upper bound, in seconds, of the random pause before re-placing after a loss, times the
attempt: two runs that each got part of what they need (nodes of multi-node runs) and both
lost must not place again in lockstep and lose together every time."""

Place = Callable[[], Awaitable[Sequence[Machine]]]
"""The run's jobs placed again from what the agents list now (each job's machine, in slot
order); raises `NoCapacity` when no host has room now."""
Submit = Callable[[Sequence[PlacedJob]], Awaitable[list[Submitted]]]
"""Submit the placed jobs (`RunHandler._submit`): all of a wave answered before it raises."""
AgentOf = Callable[[str], Awaitable[AgentClient]]
"""host -> the client of its agent."""


def lost_race(error: AgentError) -> bool:
    """Whether the agent refused a submit only because another job holds its GPUs or host
    ports now."""
    return error.status == 409 and error.code in (GPUS_UNAVAILABLE, PORTS_UNAVAILABLE)


async def admit(
    run: RunSubmission,
    job_slots: Sequence[JobSlot],
    first: Sequence[Machine],
    place: Place,
    submit: Submit,
    agent_of: AgentOf,
    progress: Callable[[str], None],
    sleep: Callable[[float], Awaitable[None]],
    attempts: int = MAX_ATTEMPTS,
) -> list[Submitted]:
    """Submit `run`'s jobs (`job_slots`) to the machines `first` gives them (the plan's
    placement, honoured as it is); when an agent refuses one because its GPUs were taken
    meanwhile, withdraw this attempt's jobs, `place` again and submit again, `attempts` times
    in all. `NoCapacity` (naming the conflict) when no host has room any more or every attempt
    lost; any other error as it is. `sleep` is the apply's clock's (tests skip the pause)."""
    address = f"{run_kind(run.spec)}.{run.run_name}"
    machines = first
    for attempt in range(1, attempts + 1):
        placed = [PlacedJob(s, m) for s, m in zip(job_slots, machines, strict=True)]
        try:
            return await submit(placed)
        except AgentError as e:
            if not lost_race(e):
                raise
            lost = e
        log.info("%s: attempt %d lost the race for GPUs: %s", address, attempt, lost)
        progress(f"{CONFLICT}: withdrawing, then placing again")
        await withdraw(run, placed, agent_of)
        if attempt == attempts:
            break
        await sleep(random.uniform(0, BACKOFF * attempt))
        try:
            machines = await place()
        except NoCapacity as e:
            # what the winner holds leaves no room now: say so, with what the run waits for
            raise NoCapacity(e.provider, f"{CONFLICT}; {e.detail}", address) from lost
    raise NoCapacity(
        placed[0].machine.fleet,
        f"{CONFLICT}; {attempts} attempts in a row lost to others ({lost.detail})",
        address,
    ) from lost


async def withdraw(run: RunSubmission, placed: Sequence[PlacedJob], agent_of: AgentOf) -> None:
    """Remove every job of `placed` that its agent holds (started or not): this attempt's
    jobs were never recorded, and a kept one would hold GPUs the next placement counts on.

    A force delete aborts at once, with no graceful window: the job started a moment ago and
    is not the run anyone will see. Jobs the agent refused are not there (404)."""
    limit = asyncio.Semaphore(MAX_CONCURRENT_WITHDRAWALS)

    async def one(job: PlacedJob) -> None:
        ident = job_id(run.run_name, job.slot, run.generation, run.deployment)
        async with limit:
            agent = await agent_of(job.machine.host)
            try:
                await agent.delete(ident, force=True)
            except AgentError as e:
                if e.status != 404:
                    raise

    await asyncio.gather(*(one(j) for j in placed))
