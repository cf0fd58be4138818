"""Rolling a service onto a new spec, one replica at a time (dstack's rolling deployment).

Each job record says which spec it runs (`JobRecord.spec_hash`, a hash of the fields a job
runs: `job_spec_hash`); the entry's spec is the target. A replica whose job runs another spec
is outdated. One `step` moves the rollout on by one action:
- no replacement yet for the first outdated replica: place and submit one on the target spec
  (an id made of the rollout's generation, so submitting it again is harmless);
- the replacement still starting: wait; it runs (and, on this machine, its port answers):
  stop the old job (`terminated_by_server`), so never fewer than `replicas` run;
- the replacement ended before it ran: remove it and record the error; the rollout stops
  there (old replicas keep serving) until the spec changes again.
Old jobs that have ended are removed on the way. `apply` (`roll`) repeats steps, committing
after each, until done; an apply killed midway leaves the entry saying so (`rollout` in its
attributes, outdated jobs), and watch's `Rollout` actor does one step per tick until done.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from dstack_plan.agent.api_models import JobStatus
from dstack_plan.agent.protocol import TERMINATED_BY_SERVER
from dstack_plan.config.runs import ServiceSpec
from dstack_plan.errors import ProviderError
from dstack_plan.plan.kinds import ROLLOUT_KEY
from dstack_plan.plan.model import DEPOSED_KEY, ResourceChange
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.runs.health import run_status
from dstack_plan.runs.jobs import stop_seconds
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.runs.rollout_jobs import (
    RunPlacer,
    job_info,
    job_infos,
    ready,
    remove_jobs,
    start_replica,
)
from dstack_plan.runs.rollout_record import (
    RUNNING,
    Rollout,
    active,
    hash_of,
    in_progress,
    job_spec_hash,
    outdated,
    progress_note,
    rolls,
    stamped,
)
from dstack_plan.state.model import ResourceState, State, timestamp

if TYPE_CHECKING:
    from dstack_plan.apply.handlers import ApplyContext

__all__ = [
    "Rollout",
    "Step",
    "in_progress",
    "job_spec_hash",
    "outdated",
    "progress_note",
    "roll",
    "rolls",
    "stamped",
    "step",
]

log = logging.getLogger(__name__)

REPLICA_WAIT = 600.0
"""Seconds `apply` waits for one new replica to run (an image pull may be slow)."""
POLL = 0.3

StepKind = Literal["started", "waiting", "replaced", "done", "failed"]


class Step(NamedTuple):
    entry: ResourceState
    """The entry as the step left it (to commit)."""
    kind: StepKind
    message: str = ""


async def roll(
    handler: RunPlacer, current: ResourceState, change: ResourceChange, ctx: ApplyContext
) -> tuple[str, dict[str, Any]]:
    """Carry out a rolling update in apply: the entry moves to `change.after` at once (its
    jobs stamped with what they run), then one replica after the other, committing after
    each step. The final (status, attributes)."""
    assert change.after is not None
    entry = stamped(current).updated(now=timestamp(ctx.clock), spec=change.after)
    stopped = Rollout.of(entry.attributes)
    if stopped is not None and stopped.error:  # applied again: try again
        entry = _with(entry, rollout=None)
    entry = await _commit(ctx, entry)
    waited_since = ctx.clock.now()
    while True:
        result = await step(handler, entry, ctx)
        if result.message:
            ctx.progress(change.address, result.message)
        if result.entry != entry:
            entry = await _commit(ctx, result.entry)
        if result.kind == "done":
            break
        if result.kind == "failed":
            raise ProviderError(RunRecord.of(entry).fleet, result.message, change.address)
        if result.kind == "waiting":
            if ctx.clock.now() - waited_since > REPLICA_WAIT:
                raise ProviderError(
                    RunRecord.of(entry).fleet,
                    f"a new replica did not run within {REPLICA_WAIT:g}s; the rollout goes "
                    "on under dstack watch",
                    change.address,
                )
            await ctx.clock.sleep(POLL)
        else:
            waited_since = ctx.clock.now()
    infos = await job_infos(handler, entry, ctx.current_state())
    attributes = {k: v for k, v in entry.attributes.items() if k != DEPOSED_KEY}
    return run_status(list(infos.values())), attributes


async def step(handler: RunPlacer, entry: ResourceState, ctx: ApplyContext) -> Step:
    """Move the rollout of `entry` on by one action (see the module docstring)."""
    state = ctx.current_state()
    spec = spec_from_normalized(entry.kind, entry.spec)
    assert isinstance(spec, ServiceSpec)
    target = job_spec_hash(entry.spec)
    rollout = Rollout.of(entry.attributes)
    if rollout is None or rollout.target != target:
        now = ctx.clock.now()
        rollout = Rollout(target=target, generation=int(now * 1000), started_at=now)
        entry = _with(entry, rollout=rollout)
    if rollout.error:
        return Step(entry, "failed", rollout.error)
    infos = await job_infos(handler, entry, state)
    record = RunRecord.of(entry)
    jobs = [j.refreshed(infos[j.id]) if j.id in infos else j for j in record.jobs]
    entry = _with(entry, jobs=jobs)
    old = [j for j in jobs if hash_of(j, entry) != target]
    new = {j.replica: j for j in jobs if hash_of(j, entry) == target and active(j.status)}
    # old jobs that ended give way (their replicas run on the new spec or are retry's)
    ended = [j for j in old if not active(j.status) and j.replica in new]
    if ended:
        await remove_jobs(handler, record.fleet, ended, state)
        jobs = [j for j in jobs if j not in ended]
        entry = _with(entry, jobs=jobs)
    waiting = sorted({j.replica for j in old if j.status in RUNNING})
    if not waiting:
        if any(j.status == JobStatus.TERMINATING.value for j in old):
            return Step(entry, "waiting")
        return Step(_with(entry, rollout=None), "done", "all replicas run the new spec")
    replica = waiting[0]
    fresh = new.get(replica)
    if fresh is None:
        try:
            fresh = await start_replica(handler, entry, spec, replica, rollout.generation, ctx)
        except ProviderError as e:
            if any(j.status == JobStatus.TERMINATING.value for j in old):
                return Step(entry, "waiting")  # a stopping old replica frees its room
            raise ProviderError(
                record.fleet,
                f"replica {replica}: no room for a new replica beside the old one ({e.detail}); "
                f"`dstack apply --replace {entry.address}` replaces the service at once",
                entry.address,
            ) from None
        entry = _with(entry, jobs=[*jobs, fresh])
        return Step(entry, "started", f"replica {replica}: started {fresh.id} on the new spec")
    info = infos.get(fresh.id) or await job_info(handler, record.fleet, fresh, state)
    if info is not None and info.finished:
        await remove_jobs(handler, record.fleet, [fresh], state)
        reason = info.termination_reason
        why = info.status.value + (f": {reason.value}" if reason else "")
        error = f"replica {replica} on the new spec ended ({why}) before it ran"
        stopped = rollout.model_copy(update={"error": error})
        entry = _with(entry, jobs=[j for j in jobs if j.id != fresh.id], rollout=stopped)
        return Step(entry, "failed", f"{error}; the old replicas keep running")
    if info is None or not await ready(info, record.fleet, ctx.clock.now()):
        return Step(entry, "waiting")
    for job in (j for j in old if j.replica == replica and j.status in RUNNING):
        agent = await handler.machines.agent(record.fleet, job.host, state)
        timeout = stop_seconds(spec)
        stopping = await agent.stop(job.id, timeout=timeout, reason=TERMINATED_BY_SERVER)
        key = handler.machines.machine_key(record.fleet, job.host)
        handler.machines.listings.record(key, [stopping])  # the command's listing: stopping
        log.info(
            "%s: replica %d runs the new spec: stopping %s",
            entry.address,
            replica,
            job.id,
            extra={
                "event": "rollout_replaced",
                "address": entry.address,
                "job_id": job.id,
                "host": job.host,
                "resource_type": "job",
            },
        )
    jobs = [
        j._replace(status=JobStatus.TERMINATING.value) if j.replica == replica and j in old else j
        for j in jobs
    ]
    return Step(_with(entry, jobs=jobs), "replaced", f"replica {replica}: old job stopped")


def _with(
    entry: ResourceState, *, jobs: list[JobRecord] | None = None, rollout: Any = ...
) -> ResourceState:
    attributes = dict(entry.attributes)
    if jobs is not None:
        attributes["jobs"] = [j.to_json() for j in jobs]
    if rollout is None:
        attributes.pop(ROLLOUT_KEY, None)
    elif isinstance(rollout, Rollout):
        attributes[ROLLOUT_KEY] = rollout.model_dump(mode="json")
    return entry.updated(now=entry.updated_at, attributes=attributes)


async def _commit(ctx: ApplyContext, entry: ResourceState) -> ResourceState:
    """Write `entry` now (keeping the deposed objects the stored one holds); the entry as
    written. Without a commit channel (a handler used on its own) it is only returned."""
    if ctx.commit is None:
        return entry
    now = timestamp(ctx.clock)

    def mutate(state: State) -> State:
        stored = state.get(entry.address)
        attributes = dict(entry.attributes)
        if stored is not None and DEPOSED_KEY in stored.attributes:
            attributes[DEPOSED_KEY] = stored.attributes[DEPOSED_KEY]
        base = stored or entry
        return state.with_resource(
            base.updated(now=now, spec=entry.spec, status=entry.status, attributes=attributes)
        )

    written = await ctx.commit(mutate)
    stored = written.get(entry.address)
    return entry if stored is None else _for_handler(stored)


def _for_handler(entry: ResourceState) -> ResourceState:
    from dstack_plan.apply.records import for_handler

    return for_handler(entry)
