"""Fair share with borrowing and reclaim, replayed on a GPU cluster trace (Alibaba openb, 2023).

    python benchmarks/fair_share.py [--nodes CSV] [--pods CSV] [--tenants a:50,b:30,c:20]
                                    [--seed N] [--json]

Tenants share the trace's cluster (1,213 nodes, 6,212 GPUs): each is guaranteed a percentage of
its GPUs (`--tenants NAME:PCT[:BORROW_PCT],...`; no borrowing limit unless BORROW_PCT is
given), borrows idle GPUs beyond it, and takes them back by preemption
(`dstack_plan.scheduler.fair_share`). Placement is the scheduler's own packing
(`dstack_plan.scheduler.packing`: `Scorer`, `choice_key`, as in `scheduler_trace.py`).

The workload: the trace's pods (their shapes and durations), in creation order. The trace is
a snapshot of a lightly loaded cluster (its 8,152 pods ask 6,087 GPUs in all, fewer than the
cluster has, spread over 150 days), so it is replayed `LOOPS` = 6 times back to back, each
replay's arrival times compressed `COMPRESSION` = 8,000 times (counted from the 5th percentile
of creation times, the trace's first months holding a few pods; earlier pods arrive at the
start of their replay): each replay's 31 busy days arrive in 5.6 minutes, the run lasts 34
minutes (48,912 arrivals), and the demand exceeds the cluster for about 80% of it (the table
says how much). Durations are the trace's own. Each arrival goes to a tenant drawn uniformly
at random (`--seed`), whatever its guarantee.

A discrete-event simulation: arrivals, completions after each pod's duration, and a watch tick
every `WATCH_INTERVAL` seconds at which reclaim decisions are made. A preempted job keeps its
GPUs for `GRACE` seconds (SIGTERM, then `stop_duration`), then goes to the back of its
tenant's queue and restarts from the start (no checkpoints: the pessimistic case). At every
event, jobs within their tenant's guarantee are placed first (the tenant furthest under its
guarantee first, each tenant's queue in order, a job that does not fit letting later ones
pass), then borrowing jobs (the tenant least served relative to its guarantee first). A
borrowing job is refused a host where some tenant under its guarantee has a pending job that
would fit once the borrowed jobs there left: it would reclaim it at the next tick (no loop).
A claimant's host is held for it while its victims stop. The baseline runs the same arrivals
through one FIFO queue (one tenant owning the whole cluster) with the same packing.

Measured, over the saturated period (every tenant has pending GPU work; for the baseline, its
queue has): each tenant's share of the allocated GPU-time (`share_pct`) against weighted fair
sharing of the same GPU-time (`fair_pct`: guarantees as weights, each tenant capped at what it
holds and waits for), its preemptions, the p95 time from its unmet demand under its guarantee
to the reclaimed GPUs (`reclaim_p95_s`: jobs for which victims were preempted, from the moment
they were pending within the guarantee without room to their start); the unallocated GPU
percentage against the baseline's; and the mean scheduler time per job started (admission,
placement and reclaim, the attempts that failed included; wall-clock time, so run it alone).
Two memos speed the simulation up (`FEW_HOSTS`, and a borrowing job refused its best hosts
is not tried again until a host is freed or the unmet demand changes); the default run makes
the same decisions without them.

Targets: every tenant within 3 points of its fair share; unallocated GPUs at most 1 point
above the baseline; reclaim p95 within one watch interval plus the grace period (60 s);
under 5 ms of scheduling per job on the 1,213 nodes; the whole run under 10 minutes.
The table and a verdict line go to stdout; with `--json`, stdout is one line, the object
`{"tenants": {NAME: {"guarantee_pct", "fair_pct", "share_pct", "preemptions",
"reclaim_p95_s"}}, "unallocated_pct", "single_queue_unallocated_pct", "decision_ms"}`, and
the table goes to stderr.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler_trace import DATA, Cluster, Node, Pod, load_nodes, load_pods, workload_of  # noqa: E402
from scheduler_trace import shape as pod_shape  # noqa: E402

from dstack_plan.scheduler.fair_share import (  # noqa: E402
    EPSILON,
    Held,
    Tenant,
    admit,
    freed,
    gpu_amount,
    reclaim,
)
from dstack_plan.scheduler.packing import (  # noqa: E402
    HostState,
    Move,
    Scorer,
    Shape,
    choice_key,
    fits,
)

WATCH_INTERVAL = 30.0
"""`dstack watch`'s default interval: reclaim decisions are made at its ticks."""
GRACE = 30.0
"""A run's default `stop_duration`: a preempted job holds its GPUs this long."""
COMPRESSION = 8000
"""Arrival times are divided by this (durations are not)."""
LOOPS = 6
"""The trace is replayed this many times back to back."""
DENSE_FROM = 0.05
"""Arrival times count from this quantile of the creation times (the trace's first months
hold a few pods only)."""
GUARD_TRIES = 8
"""Hosts a borrowing job tries, best first, when the best ones are guarded for a claimant."""
FEW_HOSTS = 128
"""A shape that fits on at most this many hosts is looked for on those (and on hosts freed
since) rather than on all: the simulation's own speed-up, the policy is the same."""
UNMET_SCAN = 2000
"""Pending jobs of one tenant looked at per pass for its unmet demand under its guarantee."""
TARGET_FAIR_POINTS = 3.0
TARGET_UNALLOCATED_POINTS = 1.0
TARGET_RECLAIM_S = WATCH_INTERVAL + GRACE
TARGET_DECISION_MS = 5.0
TARGET_RUN_S = 600.0


@dataclass(eq=False, slots=True)
class Job:
    id: int
    tenant: str
    shape: Shape
    gpus: float
    duration: float
    arrival: float
    enqueued: float = 0.0
    node: int = -1
    taken: list[int] = field(default_factory=list)
    started: float = 0.0
    epoch: int = 0
    stopping: bool = False
    unmet_since: float | None = None
    reclaimed: bool = False
    """Victims were preempted for it (in its current wait)."""


class Pending:
    """One tenant's queue: per job shape, its jobs in the order they joined."""

    def __init__(self) -> None:
        self.by_shape: dict[Shape, deque[Job]] = {}
        self.gpu_jobs = 0
        self.gpus = 0.0

    def push(self, job: Job) -> None:
        self.by_shape.setdefault(job.shape, deque()).append(job)
        self.gpu_jobs += job.gpus > 0
        self.gpus += job.gpus

    def remove(self, job: Job) -> None:
        queue = self.by_shape[job.shape]
        if queue[0] is job:
            queue.popleft()
        else:
            queue.remove(job)
        self.gpu_jobs -= job.gpus > 0
        self.gpus -= job.gpus

    def heads(self, gpu_only: bool = False) -> list[tuple[float, int, Shape]]:
        """A heap of the shapes' first jobs, oldest first."""
        heap = [
            (q[0].enqueued, q[0].id, s)
            for s, q in self.by_shape.items()
            if q and (s.gpus or not gpu_only)
        ]
        heapq.heapify(heap)
        return heap


class Guard:
    """Whether a borrowing job may go to a node; says no after `GUARD_TRIES` nodes."""

    def __init__(self, allowed: Callable[[int], bool]) -> None:
        self.allowed = allowed
        self.asked = 0

    def __call__(self, node: int) -> bool:
        self.asked += 1
        return self.asked <= GUARD_TRIES and self.allowed(node)


@dataclass
class Reservation:
    job: Job
    victims: set[int]


class Simulation:
    """The cluster, the tenants' queues and the metrics of one run."""

    def __init__(
        self,
        nodes: list[Node],
        scorer: Scorer,
        tenants: list[Tenant],
        jobs: list[Job],
        horizon: float,
    ) -> None:
        self.cluster = Cluster(nodes)
        self.names = [n.name for n in nodes]
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.scorer = scorer
        self.tenants = tenants
        self.capacity = self.cluster.capacity / 1000
        self.guarantee = {t.name: t.guarantee_gpus for t in tenants}
        self.jobs = jobs
        self.horizon = horizon
        self.pending = {t.name: Pending() for t in tenants}
        self.used = dict.fromkeys(self.guarantee, 0.0)  # held, not stopping, plus reserved
        self.holding = dict.fromkeys(self.guarantee, 0.0)  # what the GPUs hold now
        self.on_node: list[set[int]] = [set() for _ in nodes]
        self.running: dict[int, Job] = {}
        self.reserved: dict[int, Reservation] = {}
        self.reserved_gpus = dict.fromkeys(self.guarantee, 0.0)
        self.reserved_jobs = dict.fromkeys(self.guarantee, 0)
        self.unmet: dict[str, list[Job]] = {t: [] for t in self.guarantee}
        self.unmet_shapes: dict[str, dict[Shape, float]] = {}
        self.events: list[tuple[float, int, int, Job | None, int]] = []
        self.seq = 0
        # the fit memo: a shape that found no host fits later only on a host freed since
        self.release_seq = 0
        self.release_log: list[int] = []
        self.maybe: dict[Shape, tuple[int, set[int]]] = {}
        self.guard_cache: dict[int, dict[str, float]] = {}
        self.unmet_version = 0
        self.reclaiming = True
        self.guarded_out: dict[Shape, tuple[int, int]] = {}
        self._totals: tuple[tuple[float, ...], list[Held]] = ((), [])
        # metrics
        self.now = 0.0
        self.saturated_s = 0.0
        self.alloc_s = 0.0
        self.unalloc_s = 0.0
        self.held_s = dict.fromkeys(self.guarantee, 0.0)
        self.fair_s = dict.fromkeys(self.guarantee, 0.0)
        self.preemptions = dict.fromkeys(self.guarantee, 0)
        self.reclaim_waits: dict[str, list[float]] = {t: [] for t in self.guarantee}
        self.unmet_waits: dict[str, list[float]] = {t: [] for t in self.guarantee}
        self.decision_s = 0.0
        self.starts = 0
        self.reclaim_calls = 0

    # events ----------------------------------------------------------------------------

    ARRIVE, DONE, STOPPED, TICK = 0, 1, 2, 3

    def push(self, at: float, kind: int, job: Job | None = None, epoch: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, job, epoch))

    def run(self, ticks: bool) -> None:
        """Replay the arrivals up to the horizon; `ticks`: with watch ticks, borrowing and
        reclaim (False: the baseline)."""
        self.reclaiming = ticks
        for job in self.jobs:
            self.push(job.arrival, self.ARRIVE, job)
        if ticks:
            self.push(WATCH_INTERVAL, self.TICK)
        while self.events and self.events[0][0] <= self.horizon:
            now = self.events[0][0]
            self.advance(now)
            tick = False
            while self.events and self.events[0][0] == now:
                _, _, kind, job, epoch = heapq.heappop(self.events)
                if kind == self.TICK:
                    tick = True
                elif job is not None:
                    self.apply(kind, job, epoch, now)
            began = time.perf_counter()
            self.schedule(now)
            if tick:
                self.reclaim_round(now)
                self.push(now + WATCH_INTERVAL, self.TICK)
            self.decision_s += time.perf_counter() - began
        self.advance(self.horizon)

    def apply(self, kind: int, job: Job, epoch: int, now: float) -> None:
        if kind == self.ARRIVE:
            job.enqueued = now
            self.pending[job.tenant].push(job)
        elif epoch != job.epoch or job.id not in self.running:
            return  # a completion of an attempt that was preempted
        elif kind == self.DONE:
            self.release(job)
        elif kind == self.STOPPED:
            self.release(job)
            job.enqueued, job.reclaimed, job.unmet_since = now, False, None
            self.pending[job.tenant].push(job)  # restarts from the start

    def advance(self, to: float) -> None:
        """Integrate the metrics over the time since the last event."""
        to = min(to, self.horizon)
        span = to - self.now
        if span <= 0:
            return
        self.now = to
        waiting = {t: self.pending[t].gpu_jobs + self.reserved_jobs[t] for t in self.guarantee}
        if not all(waiting.values()):
            return
        allocated = self.cluster.allocated / 1000
        self.saturated_s += span
        self.alloc_s += allocated * span
        self.unalloc_s += (self.capacity - allocated) * span
        demand = {
            t: self.holding[t] + self.pending[t].gpus + self.reserved_gpus[t]
            for t in self.guarantee
        }
        fair = water_fill(allocated, self.guarantee, demand)
        for t in self.guarantee:
            self.held_s[t] += self.holding[t] * span
            self.fair_s[t] += fair[t] * span

    # placement -------------------------------------------------------------------------

    def released(self, node: int) -> None:
        self.release_seq += 1
        self.release_log.append(node)

    def candidates(self, shape: Shape) -> list[int] | None:
        """The hosts that may take `shape` now, or None for any host (look at them all).

        Once a look at all hosts found few that fit, only those and hosts freed since can:
        a host that did not fit has only lost room since, unless something on it ended."""
        memo = self.maybe.get(shape)
        if memo is None:
            return None
        since, nodes = memo
        if since != self.release_seq:
            nodes = nodes.union(self.release_log[since:])
        states = self.cluster.states
        fit = {n for n in nodes if n not in self.reserved and fits(states[n], shape)}
        if len(fit) > FEW_HOSTS:
            del self.maybe[shape]
            return None
        self.maybe[shape] = (self.release_seq, fit)
        return sorted(fit)

    def choose(
        self,
        shape: Shape,
        nodes: list[int] | None,
        allowed: Callable[[int], bool] | None = None,
    ) -> tuple[int, int | None] | None:
        """The packing's best host for `shape` (and the free amount of the GPU a share
        takes), among `nodes` (None: all; see `candidates`), hosts not held for a claimant
        and `allowed`."""
        cluster, scorer = self.cluster, self.scorer
        pressure = scorer.pressure(cluster.free_by_model) if shape.gpus else {}
        ranked: list[tuple[tuple, int, HostState, Move]] = []
        if nodes is None:
            feasible = 0
            for state, members in cluster.groups.items():
                move = scorer.move(state, shape)
                if move is None:
                    continue
                first = next((m for m in members if m not in self.reserved), None)
                if first is None:
                    continue
                feasible += len(members)
                key = choice_key(move, pressure.get(state.model, 0.0), self.names[first])
                ranked.append((key, first, state, move))
            if feasible <= FEW_HOSTS:
                fit = {m for _, first, state, _ in ranked for m in cluster.groups[state]}
                self.maybe[shape] = (self.release_seq, fit - self.reserved.keys())
        else:
            for node in nodes:
                state = cluster.states[node]
                move = scorer.move(state, shape)
                if move is not None:
                    key = choice_key(move, pressure.get(state.model, 0.0), self.names[node])
                    ranked.append((key, node, state, move))
        if not ranked:
            return None
        if allowed is None:
            _, node, state, move = min(ranked)
            return node, state.gpus[move.taken[0]] if move.taken else None
        ranked.sort()
        for _, first, state, move in ranked:
            group = [first] if nodes is not None else cluster.groups[state]
            for node in group:
                if node not in self.reserved and allowed(node):
                    return node, state.gpus[move.taken[0]] if move.taken else None
        return None

    def start(self, job: Job, node: int, from_free: int | None, now: float) -> None:
        job.taken = self.cluster.take(node, job.shape, from_free)
        job.node, job.started, job.stopping = node, now, False
        self.running[job.id] = job
        self.on_node[node].add(job.id)
        self.holding[job.tenant] += job.gpus
        self.push(now + job.duration, self.DONE, job, job.epoch)
        if job.unmet_since is not None:
            waits = self.reclaim_waits if job.reclaimed else self.unmet_waits
            waits[job.tenant].append(now - job.unmet_since)
        job.unmet_since, job.reclaimed = None, False
        self.starts += 1

    def release(self, job: Job) -> None:
        self.cluster.release(job.node, job.shape, job.taken)
        del self.running[job.id]
        self.on_node[job.node].discard(job.id)
        self.holding[job.tenant] -= job.gpus
        if not job.stopping:
            self.used[job.tenant] -= job.gpus
        reservation = self.reserved.get(job.node)
        if reservation is not None:
            reservation.victims.discard(job.id)
        job.epoch += 1
        job.stopping = False
        self.released(job.node)

    def totals(self) -> list[Held]:
        """What each tenant holds, for `admit` (one entry per tenant)."""
        key = tuple(self.used.values())
        if self._totals[0] != key:
            self._totals = (key, [Held("", t, "", gpus, 0.0) for t, gpus in self.used.items()])
        return self._totals[1]

    # the policy ------------------------------------------------------------------------

    def schedule(self, now: float) -> None:
        for node, reservation in list(self.reserved.items()):
            if not reservation.victims:
                self.start_reserved(node, reservation, now)
        order = sorted(self.guarantee, key=self.served)
        for tenant in order:
            self.place_within(tenant, now)
        if self.reclaiming:  # the baseline's one queue owns the cluster: it never borrows
            self.find_unmet(now)
            self.borrow(now)

    def served(self, tenant: str) -> float:
        guarantee = self.guarantee[tenant]
        return self.used[tenant] / guarantee if guarantee > 0 else float("inf")

    def start_reserved(self, node: int, reservation: Reservation, now: float) -> None:
        del self.reserved[node]
        job = reservation.job
        self.reserved_gpus[job.tenant] -= job.gpus
        self.reserved_jobs[job.tenant] -= 1
        move = self.scorer.move(self.cluster.states[node], job.shape)
        if move is None:  # cannot happen: the host was held for it; queue it again
            self.used[job.tenant] -= job.gpus
            self.pending[job.tenant].push(job)
        else:
            state = self.cluster.states[node]
            self.start(job, node, state.gpus[move.taken[0]] if move.taken else None, now)
        self.released(node)  # what is left on the host is free for others again

    def place_within(self, tenant: str, now: float) -> None:
        """Start the tenant's jobs that keep it within its guarantee, in queue order."""
        queue, guarantee = self.pending[tenant], self.guarantee[tenant]
        heap = queue.heads()
        while heap:
            _, _, shape = heapq.heappop(heap)
            job = queue.by_shape[shape][0]
            if self.used[tenant] + job.gpus > guarantee + EPSILON:
                continue  # it would borrow
            nodes = self.candidates(shape)
            if nodes == []:
                continue  # no host can take it (the cheap answer of the fit memo)
            if not admit(tenant, job.gpus, self.tenants, self.totals(), self.capacity, {}).ok:
                continue
            choice = self.choose(shape, nodes)
            if choice is None:
                continue
            queue.remove(job)
            self.used[tenant] += job.gpus
            self.start(job, choice[0], choice[1], now)
            rest = queue.by_shape[shape]
            if rest:
                heapq.heappush(heap, (rest[0].enqueued, rest[0].id, shape))

    def find_unmet(self, now: float) -> None:
        """Each tenant's pending jobs within its guarantee that found no room."""
        before_shapes, self.unmet_shapes = self.unmet_shapes, {}
        for tenant, guarantee in self.guarantee.items():
            before, jobs = self.unmet[tenant], []
            claim = self.used[tenant]
            if claim < guarantee - EPSILON:
                # in queue order; a shape that no longer fits in the guarantee drops out
                heap = [
                    (q[0].enqueued, q[0].id, 0, q)
                    for s, q in self.pending[tenant].by_shape.items()
                    if q and s.gpus
                ]
                heapq.heapify(heap)
                while heap and len(jobs) < UNMET_SCAN:
                    _, _, at, queue = heap[0]
                    job = queue[at]
                    if claim + job.gpus > guarantee + EPSILON:
                        heapq.heappop(heap)
                        continue
                    jobs.append(job)
                    claim += job.gpus
                    if at + 1 < len(queue):
                        following = queue[at + 1]
                        heapq.heapreplace(heap, (following.enqueued, following.id, at + 1, queue))
                    else:
                        heapq.heappop(heap)
            now_unmet = {job.id for job in jobs}
            for job in before:
                if job.id not in now_unmet and not job.reclaimed:
                    job.unmet_since = None  # no longer within its tenant's guarantee
            for job in jobs:
                if job.unmet_since is None:
                    job.unmet_since = now
            self.unmet[tenant] = jobs
            if jobs:
                shapes: dict[Shape, float] = {}
                for job in jobs:
                    shapes[job.shape] = shapes.get(job.shape, 0.0) + job.gpus
                self.unmet_shapes[tenant] = shapes
        self.guard_cache = {}
        if self.unmet_shapes != before_shapes:
            self.unmet_version += 1

    def at_risk(self, node: int) -> dict[str, float]:
        """GPUs of unmet jobs under a guarantee that would fit on the node once the
        borrowed jobs there left: a job borrowing there would be reclaimed for them."""
        known = self.guard_cache.get(node)
        if known is not None:
            return known
        over = {t for t, used in self.used.items() if used > self.guarantee[t] + EPSILON}
        borrowed = [
            self.held(self.running[j])
            for j in self.on_node[node]
            if self.running[j].tenant in over and not self.running[j].stopping
        ]
        node_state = self.cluster.states[node]
        free = HostState(
            node_state.model,
            self.cluster.cpu[node],
            self.cluster.memory[node],
            tuple(self.cluster.free[node]),
        )
        state = freed(free, borrowed)
        risk: dict[str, float] = {}
        for tenant, shapes in self.unmet_shapes.items():
            for shape, gpus in shapes.items():
                if fits(state, shape):
                    risk[tenant] = risk.get(tenant, 0.0) + gpus
        self.guard_cache[node] = risk
        return risk

    def held(self, job: Job) -> Held:
        return Held(
            str(job.id),
            job.tenant,
            self.names[job.node],
            job.gpus,
            job.started,
            shape=job.shape,
            gpu_indices=tuple(job.taken),
        )

    def borrow(self, now: float) -> None:
        """Start jobs beyond their tenants' guarantees on idle GPUs, the tenant least
        served relative to its guarantee first."""
        heaps = {t: self.pending[t].heads(gpu_only=True) for t in self.guarantee}
        active = [t for t, heap in heaps.items() if heap]
        while active:
            tenant = min(active, key=self.served)
            if not self.borrow_one(tenant, heaps[tenant], now):
                active.remove(tenant)

    def guard(self, tenant: str, gpus: float, totals: list[Held]) -> Guard:
        """May `tenant` borrow `gpus` on a node (`admit`, told what waits there)?"""

        def allowed(node: int) -> bool:
            risk = self.at_risk(node)
            return not risk or admit(tenant, gpus, self.tenants, totals, self.capacity, risk).ok

        return Guard(allowed)

    def borrow_one(self, tenant: str, heap: list[tuple[float, int, Shape]], now: float) -> bool:
        queue = self.pending[tenant]
        while heap:
            shape = heap[0][2]
            job = queue.by_shape[shape][0]
            nodes = self.candidates(shape)
            if nodes == []:
                heapq.heappop(heap)
                continue
            totals = self.totals()
            if not admit(tenant, job.gpus, self.tenants, totals, self.capacity, {}).ok:
                heapq.heappop(heap)  # over its borrowing limit (or no GPUs left at all)
                continue
            now_state = (self.release_seq, self.unmet_version)
            if self.guarded_out.get(shape) == now_state:
                heapq.heappop(heap)  # refused its best hosts since nothing changed
                continue
            guard = self.guard(tenant, job.gpus, totals)
            choice = self.choose(shape, nodes, guard)
            if choice is None:
                if guard.asked:
                    self.guarded_out[shape] = now_state
                heapq.heappop(heap)
                continue
            queue.remove(job)
            self.used[tenant] += job.gpus
            self.start(job, choice[0], choice[1], now)
            rest = queue.by_shape[shape]
            if rest:
                heapq.heapreplace(heap, (rest[0].enqueued, rest[0].id, shape))
            else:
                heapq.heappop(heap)
            return True
        return False

    def reclaim_round(self, now: float) -> None:
        """At a watch tick: preempt for each unmet job under a guarantee, the tenant
        furthest under its guarantee first."""
        claimants = [t for t in sorted(self.guarantee, key=self.served) if self.unmet[t]]
        over = {t for t, used in self.used.items() if used > self.guarantee[t] + EPSILON}
        if not claimants or not over:
            return
        held = [
            self.held(job)
            for job in self.running.values()
            if job.tenant in over and not job.stopping and job.node not in self.reserved
        ]
        hosts: dict[str, HostState] = {}
        for h in held:
            if h.host not in hosts:
                i = self.index[h.host]
                state = self.cluster.states[i]
                free = tuple(self.cluster.free[i])
                hosts[h.host] = HostState(
                    state.model, self.cluster.cpu[i], self.cluster.memory[i], free
                )
        failed: set[tuple[str, Shape]] = set()
        for tenant in claimants:
            for job in self.unmet[tenant]:
                if (tenant, job.shape) in failed:
                    continue
                if self.used[tenant] + job.gpus > self.guarantee[tenant] + EPSILON:
                    break
                self.reclaim_calls += 1
                victims = reclaim(tenant, job.shape, self.tenants, held, hosts, self.used)
                if not victims:
                    failed.add((tenant, job.shape))
                    continue
                host = victims[0].host
                node = self.index[host]
                for victim in victims:
                    self.preempt(self.running[int(victim.job)], now)
                self.pending[tenant].remove(job)
                self.used[tenant] += job.gpus
                self.reserved_gpus[tenant] += job.gpus
                self.reserved_jobs[tenant] += 1
                job.reclaimed = True
                self.reserved[node] = Reservation(job, {int(v.job) for v in victims})
                held = [h for h in held if h.host != host]
                del hosts[host]

    def preempt(self, job: Job, now: float) -> None:
        job.stopping = True
        self.used[job.tenant] -= job.gpus
        self.preemptions[job.tenant] += 1
        self.push(now + GRACE, self.STOPPED, job, job.epoch)


def water_fill(
    total: float, weights: dict[str, float], demand: dict[str, float]
) -> dict[str, float]:
    """Weighted max-min fair shares of `total`: in proportion to `weights`, none above its
    demand, what a capped tenant leaves shared by the others."""
    share = dict.fromkeys(weights, 0.0)
    active = {t for t in weights if demand[t] > EPSILON and weights[t] > 0}
    left = total
    while active and left > EPSILON:
        weight = sum(weights[t] for t in active)
        capped = {t for t in active if demand[t] - share[t] <= left * weights[t] / weight}
        if not capped:
            for t in active:
                share[t] += left * weights[t] / weight
            break
        for t in capped:
            left -= demand[t] - share[t]
            share[t] = demand[t]
        active -= capped
    return share


def arrivals(pods: list[Pod], names: list[str], seed: int) -> tuple[list[Job], float]:
    """The replayed workload (see the module docstring) and the time of its last arrival."""
    rng = random.Random(seed)
    timed = sorted(
        (p for p in pods if p.created is not None and p.duration is not None),
        key=lambda p: p.created or 0,
    )
    times = [p.created or 0 for p in timed]
    origin = times[int(DENSE_FROM * (len(times) - 1))]
    span = (times[-1] - origin) / COMPRESSION
    jobs = []
    for loop in range(LOOPS):
        for pod in timed:
            at = loop * span + max((pod.created or 0) - origin, 0) / COMPRESSION
            s = pod_shape(pod, True)
            jobs.append(
                Job(len(jobs), rng.choice(names), s, gpu_amount(s), float(pod.duration or 0), at)
            )
    return jobs, LOOPS * span


def parse_tenants(text: str, capacity: float) -> list[Tenant]:
    """`a:50,b:30,c:20` (percentages of the cluster's GPUs), each with an optional
    borrowing limit (`a:50:10`: 10% more at most)."""
    tenants = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise SystemExit(f"--tenants: expected NAME:PCT[:BORROW_PCT], got {item!r}")
        pct = [p if p.endswith("%") else p + "%" for p in parts[1:]]
        tenants.append(Tenant.of(parts[0], pct[0], capacity, pct[1] if len(pct) > 1 else None))
    return tenants


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[int(q * (len(ordered) - 1))], 1) if ordered else None


def run(nodes_file: Path, pods_file: Path, tenant_text: str, seed: int) -> dict:
    began = time.perf_counter()
    nodes, pods = load_nodes(nodes_file), load_pods(pods_file)
    capacity = sum(n.gpus for n in nodes)
    tenants = parse_tenants(tenant_text, capacity)
    scorer = Scorer(workload_of(pods, True))
    jobs, horizon = arrivals(pods, [t.name for t in tenants], seed)
    shared = Simulation(nodes, scorer, tenants, jobs, horizon)
    shared.run(ticks=True)
    one = [Tenant("all", capacity)]
    fifo_jobs = [Job(j.id, "all", j.shape, j.gpus, j.duration, j.arrival) for j in jobs]
    fifo = Simulation(nodes, scorer, one, fifo_jobs, horizon)
    fifo.run(ticks=False)
    result: dict = {"tenants": {}}
    for t in tenants:
        result["tenants"][t.name] = {
            "guarantee_pct": round(100 * t.guarantee_gpus / capacity, 2),
            "fair_pct": _pct(shared.fair_s[t.name], shared.alloc_s),
            "share_pct": _pct(shared.held_s[t.name], shared.alloc_s),
            "preemptions": shared.preemptions[t.name],
            "reclaim_p95_s": percentile(shared.reclaim_waits[t.name], 0.95),
        }
    result["unallocated_pct"] = _pct(shared.unalloc_s, capacity * shared.saturated_s)
    result["single_queue_unallocated_pct"] = _pct(fifo.unalloc_s, capacity * fifo.saturated_s)
    result["decision_ms"] = round(1000 * shared.decision_s / max(shared.starts, 1), 3)
    facts = {
        "nodes": len(nodes),
        "gpus": capacity,
        "arrivals": len(jobs),
        "horizon_s": round(horizon, 1),
        "saturated_pct": _pct(shared.saturated_s, horizon),
        "single_queue_saturated_pct": _pct(fifo.saturated_s, horizon),
        "starts": shared.starts,
        "single_queue_starts": fifo.starts,
        "single_queue_decision_ms": round(1000 * fifo.decision_s / max(fifo.starts, 1), 3),
        "reclaim_calls": shared.reclaim_calls,
        "reclaimed_jobs": sum(len(w) for w in shared.reclaim_waits.values()),
        "unmet_p95_s": {t: percentile(w, 0.95) for t, w in shared.unmet_waits.items()},
        "run_s": round(time.perf_counter() - began, 1),
    }
    return {"result": result, "facts": facts}


def _pct(part: float, whole: float) -> float | None:
    return round(100 * part / whole, 2) if whole > 0 else None


def verdict(result: dict, facts: dict) -> tuple[bool, str]:
    rows = result["tenants"].values()
    worst = max(abs(r["share_pct"] - r["fair_pct"]) for r in rows)
    extra = result["unallocated_pct"] - result["single_queue_unallocated_pct"]
    p95 = max((r["reclaim_p95_s"] or 0.0) for r in rows)
    checks = [
        worst <= TARGET_FAIR_POINTS,
        extra <= TARGET_UNALLOCATED_POINTS,
        p95 <= TARGET_RECLAIM_S,
        result["decision_ms"] < TARGET_DECISION_MS,
        facts["run_s"] < TARGET_RUN_S,
    ]
    text = (
        f"fair share off by {worst:.2f} points at most (target <= {TARGET_FAIR_POINTS:g}); "
        f"unallocated {extra:+.2f} points vs one queue "
        f"(target <= +{TARGET_UNALLOCATED_POINTS:g}); "
        f"reclaim p95 {p95:g} s (target <= {TARGET_RECLAIM_S:g}); "
        f"{result['decision_ms']:.3f} ms a job (target < {TARGET_DECISION_MS:g}); "
        f"run {facts['run_s']:g} s (target < {TARGET_RUN_S:g}): "
        + ("OK" if all(checks) else "MISSED")
    )
    return all(checks), text


def render(result: dict, facts: dict) -> str:
    lines = [
        f"{facts['nodes']} nodes, {facts['gpus']} GPUs; {facts['arrivals']} arrivals "
        f"({LOOPS} replays, arrivals compressed {COMPRESSION}x) over {facts['horizon_s']} s; "
        f"watch every {WATCH_INTERVAL:g} s, grace {GRACE:g} s",
        f"saturated (every tenant waiting) {facts['saturated_pct']}% of the run; "
        f"one queue waiting {facts['single_queue_saturated_pct']}%",
        f"  {'tenant':<8}{'guarantee %':>12}{'fair %':>9}{'share %':>9}{'preempted':>11}"
        f"{'reclaim p95 s':>15}{'unmet p95 s':>13}",
    ]
    for name, row in result["tenants"].items():
        unmet = facts["unmet_p95_s"][name]
        lines.append(
            f"  {name:<8}{row['guarantee_pct']:>12}{row['fair_pct']:>9}{row['share_pct']:>9}"
            f"{row['preemptions']:>11}{_cell(row['reclaim_p95_s']):>15}{_cell(unmet):>13}"
        )
    lines += [
        f"unallocated GPUs while saturated: {result['unallocated_pct']}% "
        f"(one queue: {result['single_queue_unallocated_pct']}%)",
        f"scheduling: {result['decision_ms']} ms a job started ({facts['starts']} starts, "
        f"{facts['reclaim_calls']} reclaim calls, {facts['reclaimed_jobs']} jobs given "
        f"GPUs back); one queue {facts['single_queue_decision_ms']} ms "
        f"({facts['single_queue_starts']} starts)",
        f"run time {facts['run_s']} s",
    ]
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--tenants", default="a:50,b:30,c:20")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = run(args.nodes, args.pods, args.tenants, args.seed)
    _, text = verdict(out["result"], out["facts"])
    human = sys.stderr if args.json else sys.stdout  # with --json, stdout is the one line
    print(render(out["result"], out["facts"]), file=human)
    print(text, file=human)
    if args.json:
        print(json.dumps(out["result"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
