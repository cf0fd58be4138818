"""Hosts that stop answering: marked unreachable after consecutive failed checks, their jobs
failed with `instance_unreachable` after a grace period (reference §3.5 "Reachability").

Each tick asks every machine of the fleets in state and of the fleets runs use for its
metrics (`Tick.hosts`). One failed check is not a dead host (a slow link, an agent
restarting): an SSH host is marked `unreachable` only at the FAILED_CHECKS-th consecutive
one, `unreachable_since` being the time of the first. The count lives in the fleet's host
record, so a restarted watch carries on. A job on a host unreachable for longer than GRACE_S
fails with `instance_unreachable`: its record says `failed` and the run remembers when
(`LOST_KEY`), so the retry policy, which runs after this actor in the same tick, takes it as
an interruption without asking its dead agent. SSH hosts are never terminated for it. The
host keeps the ids of the jobs given up on it (`HostRecord.lost_jobs`); when it answers again
they are stopped and removed there, so a job that ran on unseen is not run twice. The local
fleet (this machine) is never marked: its agent not answering fails the tick, and the next
one asks again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from dstack_plan.agent.protocol import FINISHED_STATUSES, TERMINATED_BY_SERVER
from dstack_plan.config.kinds import RUN_KINDS
from dstack_plan.errors import AgentError, DstackPlanError
from dstack_plan.fleets.host_status import UNREACHABLE
from dstack_plan.fleets.records import FleetRecord, HostRecord
from dstack_plan.providers.names import HOST_FLEET_PROVIDERS
from dstack_plan.runs.records import JobRecord, RunRecord, run_span_id
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.events import host_event
from dstack_plan.watch.model import HostSeen
from dstack_plan.watch.retry_model import INSTANCE_UNREACHABLE
from dstack_plan.watch.tick import Acted, Tick

log = logging.getLogger(__name__)

FAILED_CHECKS = 3
"""Consecutive failed checks that make a host unreachable."""
GRACE_S = 120.0
"""How long a host stays unreachable before its jobs fail (dstack: 2 min disconnected)."""
LOST_KEY = "unreachable_jobs"
"""Run attribute: job id -> when watch gave it up (epoch seconds) for its host."""


def lost_jobs(run: ResourceState) -> dict[str, float]:
    """The jobs of `run` given up for their host (job id -> when), as `LOST_KEY` records."""
    raw = run.attributes.get(LOST_KEY)
    if not isinstance(raw, dict):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float)}


def give_up_jobs(
    tick: Tick, fleet: str, reasons: Mapping[str, str | None], acted: Acted
) -> list[tuple[str, ResourceState, JobRecord]]:
    """Fail the unfinished jobs of the state's runs on the hosts of `fleet` that `reasons`
    names (host -> the termination reason to record on them; None: none, the retry policy
    takes them as unreachable), giving them up (`LOST_KEY`) so the retry policy does not ask
    their agent. The changed runs go to `acted`; (run address, run, job) for each job."""
    failed: list[tuple[str, ResourceState, JobRecord]] = []
    for address, run in tick.state.resources.items():
        record = RunRecord.of(run)
        if run.kind not in RUN_KINDS or run.tainted or record.fleet != fleet:
            continue
        lost = lost_jobs(run)
        failing = [
            j
            for j in record.jobs
            if j.host in reasons and j.id not in lost and j.status not in FINISHED_STATUSES
        ]
        if not failing:
            continue
        for job in failing:
            lost[job.id] = tick.now
            failed.append((address, run, job))
        jobs = [
            j._replace(status="failed", reason=reasons.get(j.host) or j.reason)
            if j.id in lost
            else j
            for j in record.jobs
        ]
        attributes = {**run.attributes, **record.with_jobs(jobs).to_json(), LOST_KEY: lost}
        acted.changed[address] = run.updated(
            now=run.updated_at, status="failed", attributes=attributes
        )
    return failed


def without_lost_jobs(run: ResourceState) -> ResourceState:
    """`run` without the job records given up for their host: what deleting the run may
    skip (their agent cannot be asked; reachability stops them when the host is back)."""
    lost = lost_jobs(run)
    record = RunRecord.of(run)
    if not any(j.id in lost for j in record.jobs):
        return run
    kept = record.with_jobs([j for j in record.jobs if j.id not in lost])
    return run.updated(now=run.updated_at, attributes={**run.attributes, **kept.to_json()})


class Reachability:
    """Counts failed checks per SSH host, fails jobs on long-lost hosts, and stops the jobs
    given up on a host once it answers again (see the module docstring)."""

    name = "reachability"

    async def act(self, tick: Tick) -> Acted:
        acted = Acted()
        by_fleet: dict[str, list[HostSeen]] = {}
        for one in tick.hosts:
            by_fleet.setdefault(one.fleet, []).append(one)
        for fleet, seen in sorted(by_fleet.items()):
            entry = tick.state.get(f"fleet.{fleet}")
            if entry is None or entry.provider not in HOST_FLEET_PROVIDERS or entry.tainted:
                continue  # the local fleet, or one this version does not manage
            read = tick.read.get(entry.address)
            before = FleetRecord.of(read).by_name() if read is not None else {}
            hosts = [
                await self._check(tick, fleet, entry, host, before.get(host.name), seen, acted)
                for host in FleetRecord.of(entry).hosts
            ]
            lost_now = self._fail_jobs(tick, fleet, hosts, acted)
            hosts = [
                h.model_copy(update={"lost_jobs": (*h.lost_jobs, *lost_now.get(h.name, ()))})
                for h in hosts
            ]
            attributes = {**entry.attributes, **FleetRecord(hosts=tuple(hosts)).to_attributes()}
            acted.changed[entry.address] = entry.updated(
                now=entry.updated_at, attributes=attributes
            )
        self._keep_lost_failed(tick, acted)
        return acted

    async def _check(
        self,
        tick: Tick,
        fleet: str,
        entry: ResourceState,
        host: HostRecord,
        before: HostRecord | None,
        seen: Sequence[HostSeen],
        acted: Acted,
    ) -> HostRecord:
        """The record of `host` to keep: as committed (`before`; a refresh rebuilds host
        records without watch's fields, and its facts are the fleet's to write, not a tick's:
        no commit every tick), with this tick's problem and check."""
        kept = before if before is not None else host
        host = kept.model_copy(update={"problem": host.problem})
        answer = next((s for s in seen if s.host == host.name), None)
        if answer is None:
            return host  # not asked this tick (its fleet's machines unknown): nothing learnt
        was_unreachable = host.failed_checks >= FAILED_CHECKS
        if answer.reachable:
            lost = await self._stop_lost(tick, fleet, host) if host.lost_jobs else ()
            if was_unreachable:
                self._event(tick, acted, entry, host, UNREACHABLE, _live(host.status), None)
            return host.model_copy(
                update={
                    "failed_checks": 0,
                    "unreachable_since": None,
                    "lost_jobs": lost,
                    "status": _live(host.status),
                }
            )
        checks = host.failed_checks + 1
        since = host.unreachable_since if host.failed_checks else tick.now
        status = UNREACHABLE if checks >= FAILED_CHECKS else _live(kept.status)
        if checks == FAILED_CHECKS:
            self._event(tick, acted, entry, host, _live(kept.status), UNREACHABLE, answer.error)
        elif checks < FAILED_CHECKS:
            log.info(
                "%s: host %s did not answer (check %d of %d): %s",
                entry.address, host.name, checks, FAILED_CHECKS, answer.error,
                extra={"event": "host_check_failed", "address": entry.address,
                       "host": host.name, "resource_type": "host"},
            )  # fmt: skip
        return host.model_copy(
            update={"failed_checks": checks, "unreachable_since": since, "status": status}
        )

    def _event(
        self,
        tick: Tick,
        acted: Acted,
        entry: ResourceState,
        host: HostRecord,
        old: str,
        new: str,
        why: str | None,
    ) -> None:
        reason = f"{host.name}: {why}" if why else host.name
        log.log(
            logging.WARNING if new == UNREACHABLE else logging.INFO,
            "%s: host %s is %s (%s)", entry.address, host.name, new, why or "answers again",
            extra={"event": "host_unreachable" if new == UNREACHABLE else "host_reachable",
                   "address": entry.address, "host": host.name,
                   "resource_type": "host"},
        )  # fmt: skip
        acted.events.append(host_event(tick.now, entry, old, new, reason))

    async def _stop_lost(self, tick: Tick, fleet: str, host: HostRecord) -> tuple[str, ...]:
        """Stop and remove the jobs given up on `host`, now that it answers; the ones that
        could not be (asked again next tick)."""
        left = []
        try:
            agent = await tick.project.machines.agent(fleet, host.name, tick.state)
        except DstackPlanError as e:
            log.warning("fleet.%s: %s: %s", fleet, host.name, e)
            return host.lost_jobs
        for job_id in host.lost_jobs:
            try:
                try:
                    await agent.stop(job_id, reason=TERMINATED_BY_SERVER)
                    await agent.delete(job_id, force=True)
                except AgentError as e:
                    if e.status != 404:
                        raise
            except DstackPlanError as e:
                log.warning("fleet.%s: could not stop %s on %s: %s", fleet, job_id, host.name, e)
                left.append(job_id)
                continue
            log.info(
                "fleet.%s: stopped %s on %s: it was given up while the host was unreachable",
                fleet, job_id, host.name,
                extra={"event": "lost_job_stopped", "address": f"fleet.{fleet}",
                       "job_id": job_id, "host": host.name, "resource_type": "job"},
            )  # fmt: skip
        return tuple(left)

    def _fail_jobs(
        self, tick: Tick, fleet: str, hosts: Sequence[HostRecord], acted: Acted
    ) -> dict[str, list[str]]:
        """Fail the active jobs on hosts of `fleet` unreachable for longer than the grace
        period; host name -> the job ids given up on it."""
        gone = {
            h.name: h.unreachable_since
            for h in hosts
            if h.failed_checks >= FAILED_CHECKS
            and h.unreachable_since is not None
            and tick.now - h.unreachable_since >= GRACE_S
        }
        given_up: dict[str, list[str]] = {}
        for address, run, job in give_up_jobs(tick, fleet, dict.fromkeys(gone), acted):
            given_up.setdefault(job.host, []).append(job.id)
            log.warning(
                "%s: job %s failed: %s: host %s unreachable since %.0f", address, job.id,
                INSTANCE_UNREACHABLE, job.host, gone[job.host] or 0.0,
                extra={"event": "job_instance_unreachable", "address": address,
                       "job_id": job.id, "host": job.host, "resource_type": "job",
                       "span_id": run_span_id(run)},
            )  # fmt: skip
        return given_up

    def _keep_lost_failed(self, tick: Tick, acted: Acted) -> None:
        """A job given up stays `failed` in its run, even when its host, back, reports it
        running until it is stopped (the refresh would take it up again). Jobs a restart
        replaced are dropped from the run's `LOST_KEY` (their hosts keep them to stop)."""
        for address, run in tick.state.resources.items():
            run = acted.changed.get(address, run)
            if run.kind not in RUN_KINDS or LOST_KEY not in run.attributes:
                continue
            record = RunRecord.of(run)
            lost = lost_jobs(run)
            recorded = {j.id: j for j in record.jobs if j.id in lost}
            if len(recorded) == len(lost) and all(j.status == "failed" for j in recorded.values()):
                continue
            jobs = [j._replace(status="failed") if j.id in lost else j for j in record.jobs]
            attributes = {**run.attributes, **record.with_jobs(jobs).to_json()}
            kept = {k: v for k, v in lost.items() if k in recorded}
            if kept:
                attributes[LOST_KEY] = kept
            else:
                del attributes[LOST_KEY]
            status = "failed" if recorded else run.status
            acted.changed[address] = run.updated(
                now=run.updated_at, status=status, attributes=attributes
            )


def _live(status: str) -> str:
    """A host's status while it is not (or no longer) counted unreachable."""
    return "idle" if status in (UNREACHABLE, "pending", "unknown") else status
