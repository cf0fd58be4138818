"""Packing policies replayed on a GPU cluster trace (Alibaba openb, 2023; Weng et al., ATC '23).

    python benchmarks/scheduler_trace.py [--nodes FILE] [--pods FILE] [--json] [--seed N]

Side by side in one run: `ours` (the scheduler's own scoring, `dstack_plan.scheduler.packing`)
and baselines written here: first fit, best fit, random fit, dot-product (Tetris alignment) and
FGD as the paper describes it. Experiments: inflation (tasks drawn from the trace until the
cluster is saturated; unallocated GPU share at 80/90/100/110% arrived workload, whole GPUs and
shared GPUs), replay in time order (queueing delay, GPU allocation), and the time per decision
of `ours` on all nodes with a queue of 10,000 jobs; also the time of one decision through the
scheduler's whole entry point (`placement.place`: matching every host's resources, reasons
for every miss), which plan, apply and watch call.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import heapq
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dstack_plan.scheduler.packing import (  # noqa: E402
    WHOLE,
    HostState,
    Scorer,
    Shape,
    Workload,
    choice_key,
    fits,
)

DATA = Path(__file__).resolve().parent / "data" / "alibaba-gpu-v2023"
"""The default trace, committed with the benchmarks (its README says where it comes from)."""
POLICIES = ("ours", "fgd", "best_fit", "first_fit", "random_fit", "dot_product")
LEVELS = (80, 90, 100, 110)
QUEUE = 10_000


class Node(NamedTuple):
    name: str
    cpu: int
    memory: int
    gpus: int
    model: str


class Pod(NamedTuple):
    cpu: int
    memory: int
    gpus: int
    gpu_milli: int
    models: frozenset[str] | None
    created: int | None
    duration: int | None


def load_nodes(path: Path) -> list[Node]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [
        Node(r["sn"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"]), r["model"])
        for r in rows
    ]


def load_pods(path: Path) -> list[Pod]:
    pods = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            spec = (r.get("gpu_spec") or "").strip()
            created = r.get("creation_time") or None
            end = r.get("deletion_time") or None
            start = r.get("scheduled_time") or created
            duration = int(end) - int(start) if end and start else None
            gpus = int(r["num_gpu"])
            pods.append(
                Pod(
                    int(r["cpu_milli"]),
                    int(r["memory_mib"]),
                    gpus,
                    int(r["gpu_milli"]) if gpus else 0,
                    frozenset(spec.split("|")) if spec else None,
                    int(created) if created else None,
                    max(duration, 0) if duration is not None else None,
                )
            )
    return pods


def shape(pod: Pod, shared: bool) -> Shape:
    milli = pod.gpu_milli if shared and pod.gpus == 1 else WHOLE
    return Shape(pod.cpu, pod.memory, pod.gpus, milli if pod.gpus else WHOLE, pod.models)


def demand(s: Shape) -> int:
    """GPU thousandths a task takes."""
    return s.gpus * min(s.gpu_milli, WHOLE)


class Cluster:
    """Nodes with real per-GPU free amounts, grouped by state: nodes in the same state are
    interchangeable, so a policy looks at each distinct state once (its first node by name)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.cpu = [n.cpu for n in nodes]
        self.memory = [n.memory for n in nodes]
        self.free = [[WHOLE] * n.gpus for n in nodes]
        self.capacity = sum(n.gpus for n in nodes) * WHOLE
        self.allocated = 0
        self.free_by_model: dict[str, int] = {}
        for n in nodes:
            self.free_by_model[n.model] = self.free_by_model.get(n.model, 0) + n.gpus * WHOLE
        self.groups: dict[HostState, list[int]] = {}
        self.states = [self._state(i) for i in range(len(nodes))]
        for i, state in enumerate(self.states):
            self.groups.setdefault(state, []).append(i)

    def _state(self, i: int) -> HostState:
        gpus = tuple(sorted(self.free[i], reverse=True))
        return HostState(self.nodes[i].model, self.cpu[i], self.memory[i], gpus)

    def take(self, i: int, s: Shape, from_free: int | None) -> list[int]:
        """Place `s` on node `i`; a shared task takes the first GPU with `from_free` free.
        Returns the GPU indices taken."""
        free = self.free[i]
        if not s.gpus:
            taken = []
        elif s.gpu_milli < WHOLE:
            taken = [free.index(from_free if from_free is not None else max(free))]
        else:
            taken = [g for g, f in enumerate(free) if f == WHOLE][: s.gpus]
        self._change(i, s, taken, -1)
        return taken

    def release(self, i: int, s: Shape, taken: list[int]) -> None:
        self._change(i, s, taken, 1)

    def _change(self, i: int, s: Shape, taken: list[int], sign: int) -> None:
        old = self.states[i]
        members = self.groups[old]
        members.remove(i)
        if not members:
            del self.groups[old]
        self.cpu[i] += sign * s.cpu
        self.memory[i] += sign * s.memory
        for g in taken:
            self.free[i][g] += sign * min(s.gpu_milli, WHOLE)
            self.allocated -= sign * min(s.gpu_milli, WHOLE)
            self.free_by_model[self.nodes[i].model] += sign * min(s.gpu_milli, WHOLE)
        new = self.states[i] = self._state(i)
        bisect.insort(self.groups.setdefault(new, []), i)


Choice = tuple[int, int | None]
"""A node, and for a shared task the free amount of the GPU it takes."""
Policy = Callable[[Cluster, Shape], Choice | None]


def ours(workload: Workload) -> Policy:
    """The scheduler's scoring: `packing.Scorer` and `packing.choice_key` (least pressed GPU
    model, then FGD, then best fit, then host name)."""
    scorer = Scorer(workload)

    def choose(cluster: Cluster, s: Shape) -> Choice | None:
        pressure = scorer.pressure(cluster.free_by_model) if s.gpus else {}
        best = None
        for state, members in cluster.groups.items():
            move = scorer.move(state, s)
            if move is not None:
                name = cluster.nodes[members[0]].name
                key = choice_key(move, pressure.get(state.model, 0.0), name)
                if best is None or key < best[0]:
                    best = (key, members[0], state, move)
        if best is None:
            return None
        _, node, state, move = best
        return node, state.gpus[move.taken[0]] if move.taken else None

    return choose


def fgd(workload: Workload) -> Policy:
    """FGD as the paper describes it: the node (and GPU) whose fragmentation under the target
    workload grows least; the first such node."""
    classes = workload.classes
    memo: dict[HostState, float] = {}

    def frag(h: HostState) -> float:
        if h in memo:
            return memo[h]
        total = sum(h.gpus)
        value = 0.0
        for t, p in classes:
            ok = t.cpu <= h.cpu and t.memory <= h.memory and t.gpus <= len(h.gpus)
            ok = ok and (not t.gpus or t.models is None or h.model in t.models)
            if not ok:
                value += p * total
            elif t.gpus and t.gpu_milli < WHOLE:
                value += p * sum(f for f in h.gpus if f < t.gpu_milli)
            elif t.gpus:
                full = sum(1 for f in h.gpus if f == WHOLE)
                value += p * (total if full < t.gpus else total - full * WHOLE)
        memo[h] = value
        return value

    def choose(cluster: Cluster, s: Shape) -> Choice | None:
        best: tuple[float, int, int | None] | None = None
        for state, members in cluster.groups.items():
            if not fits(state, s):
                continue
            options: list[int | None] = [*_options(state, s)] or [None]
            for f in options:
                after = _after(state, s, f)
                key = (frag(after) - frag(state), members[0], f)
                if best is None or key[:2] < best[:2]:
                    best = key
        return None if best is None else (best[1], best[2])

    return choose


def best_fit(cluster: Cluster, s: Shape) -> Choice | None:
    """The node left with the least free GPU, then CPU (as shares of the node); within it the
    fullest GPU that fits."""
    best = None
    for state, members in cluster.groups.items():
        if fits(state, s):
            node = cluster.nodes[members[0]]
            left = (sum(state.gpus) - demand(s)) / max(node.gpus * WHOLE, 1)
            key = (left + (state.cpu - s.cpu) / node.cpu, members[0])
            if best is None or key < best[0]:
                best = (key, min(_options(state, s), default=None))
    return None if best is None else (best[0][1], best[1])


def first_fit(cluster: Cluster, s: Shape) -> Choice | None:
    """The first node (by name) that fits; within it the first GPU that fits."""
    best = None
    for state, members in cluster.groups.items():
        if fits(state, s) and (best is None or members[0] < best):
            best = members[0]
    if best is None:
        return None
    free = next((f for f in cluster.free[best] if f >= s.gpu_milli), None)
    return best, free if s.gpus and s.gpu_milli < WHOLE else None


def random_fit(seed: int) -> Policy:
    rng = random.Random(seed)

    def choose(cluster: Cluster, s: Shape) -> Choice | None:
        feasible = [(st, m) for st, m in cluster.groups.items() if fits(st, s)]
        if not feasible:
            return None
        state, members = rng.choices(feasible, weights=[len(m) for _, m in feasible])[0]
        options = _options(state, s)
        return rng.choice(members), rng.choice(options) if options else None

    return choose


def dot_product(cluster: Cluster, s: Shape) -> Choice | None:
    """Tetris alignment: the node whose free (CPU, memory, GPU), as shares of the node, has
    the largest dot product with the task's demand; within it the fullest GPU that fits."""
    best = None
    for state, members in cluster.groups.items():
        if fits(state, s):
            node = cluster.nodes[members[0]]
            gpu_cap = max(node.gpus * WHOLE, 1)
            score = (
                s.cpu * state.cpu / node.cpu**2
                + s.memory * state.memory / node.memory**2
                + demand(s) * sum(state.gpus) / gpu_cap**2
            )
            key = (-score, members[0])
            if best is None or key < best[0]:
                best = (key, min(_options(state, s), default=None))
    return None if best is None else (best[0][1], best[1])


def _options(state: HostState, s: Shape) -> list[int]:
    """Free amounts of the GPUs a shared task could take (empty for other tasks)."""
    if not s.gpus or s.gpu_milli >= WHOLE:
        return []
    return sorted({f for f in state.gpus if f >= s.gpu_milli})


def _after(state: HostState, s: Shape, free: int | None) -> HostState:
    gpus = list(state.gpus)
    if s.gpus and s.gpu_milli < WHOLE:
        gpus[gpus.index(free if free is not None else gpus[0])] -= s.gpu_milli
    elif s.gpus:
        for g in range(s.gpus):
            gpus[g] -= WHOLE
    gpus.sort(reverse=True)
    return HostState(state.model, state.cpu - s.cpu, state.memory - s.memory, tuple(gpus))


def policies(workload: Workload, seed: int) -> dict[str, Policy]:
    return {
        "ours": ours(workload),
        "fgd": fgd(workload),
        "best_fit": best_fit,
        "first_fit": first_fit,
        "random_fit": random_fit(seed),
        "dot_product": dot_product,
    }


def workload_of(pods: list[Pod], shared: bool) -> Workload:
    """The target workload: the mix of task shapes in the trace."""
    return Workload.from_shapes(shape(p, shared) for p in pods)


def inflation(nodes: list[Node], pods: list[Pod], seed: int, shared: bool) -> dict[str, dict]:
    """Unallocated GPU share (%) at each arrived-workload level, per policy."""
    cluster0 = Cluster(nodes)
    rng = random.Random(seed)
    tasks: list[Shape] = []
    arrived = 0
    while arrived < cluster0.capacity * LEVELS[-1] / 100:
        tasks.append(shape(rng.choice(pods), shared))
        arrived += demand(tasks[-1])
    result: dict[str, dict] = {}
    for name, policy in policies(workload_of(pods, shared), seed).items():
        cluster = Cluster(nodes)
        marks = iter(LEVELS)
        level: int | None = next(marks)
        arrived = 0
        out: dict[str, float] = {}
        for task in tasks:
            arrived += demand(task)
            choice = policy(cluster, task)
            if choice is not None:
                cluster.take(choice[0], task, choice[1])
            while level is not None and arrived >= cluster.capacity * level / 100:
                out[str(level)] = round(100 * (1 - cluster.allocated / cluster.capacity), 2)
                level = next(marks, None)
        result[name] = out
    return result


def replay(nodes: list[Node], pods: list[Pod], seed: int, speedup: float = 1.0) -> dict[str, dict]:
    """Tasks in creation order, each for its traced duration, shared GPUs; a task that does
    not fit waits (FIFO, later ones may pass it) until a departure frees room. `speedup`
    compresses the time between arrivals (durations stay), to load the cluster more."""
    timed = sorted(
        (
            p._replace(created=int((p.created or 0) / speedup))
            for p in pods
            if p.created is not None and p.duration is not None
        ),
        key=lambda p: p.created or 0,
    )
    if not timed:
        return {
            n: {"mean_delay_s": None, "p95_delay_s": None, "mean_gpu_alloc_pct": None}
            for n in POLICIES
        }
    result: dict[str, dict] = {}
    for name, policy in policies(workload_of(pods, True), seed).items():
        result[name] = _replay_one(Cluster(nodes), timed, policy)
    return result


def _replay_one(cluster: Cluster, timed: list[Pod], policy: Policy) -> dict[str, float | None]:
    ends: list[tuple[int, int, int, Shape, list[int]]] = []  # end, seq, node, shape, gpus
    queue: list[tuple[Pod, Shape]] = []
    delays: list[float] = []
    area = 0.0
    start = last = timed[0].created or 0
    window = timed[-1].created or 0  # allocation is averaged over the arrivals' span
    seq = 0

    def advance(now: int) -> None:
        nonlocal area, last
        now = min(now, window)
        area += cluster.allocated * max(now - last, 0)
        last = max(last, now)

    def start_waiting(now: int) -> None:
        nonlocal seq
        waiting = []
        for pod, s in queue:
            choice = policy(cluster, s)
            if choice is None:
                waiting.append((pod, s))
                continue
            gpus = cluster.take(choice[0], s, choice[1])
            delays.append(now - (pod.created or 0))
            seq += 1
            heapq.heappush(ends, (now + (pod.duration or 0), seq, choice[0], s, gpus))
        queue[:] = waiting

    for pod in timed:
        now = pod.created or 0
        while ends and ends[0][0] <= now:
            end, _, node, s, gpus = heapq.heappop(ends)
            advance(end)
            cluster.release(node, s, gpus)
            start_waiting(end)
        advance(now)
        queue.append((pod, shape(pod, True)))
        start_waiting(now)
    while ends:  # the tail: allocation until the last departure, and who still waits
        end, _, node, s, gpus = heapq.heappop(ends)
        advance(end)
        cluster.release(node, s, gpus)
        start_waiting(end)
    span = max(window - start, 1)
    ordered = sorted(delays)
    return {
        "mean_delay_s": round(statistics.fmean(delays), 1) if delays else None,
        "p95_delay_s": float(ordered[int(0.95 * (len(ordered) - 1))]) if delays else None,
        "mean_gpu_alloc_pct": round(100 * area / span / cluster.capacity, 2),
        "never_started": len(queue),
    }


def decision_ms(nodes: list[Node], pods: list[Pod], seed: int) -> float:
    """Mean time of one `ours` decision: all nodes, a queue of 10,000 tasks drawn from the
    trace (shared GPUs), placed one after the other; failures (a full cluster) included."""
    rng = random.Random(seed + 1)
    tasks = [shape(rng.choice(pods), True) for _ in range(QUEUE)]
    policy = ours(workload_of(pods, True))
    cluster = Cluster(nodes)
    spent = 0.0
    for task in tasks:
        began = time.perf_counter()
        choice = policy(cluster, task)
        spent += time.perf_counter() - began
        if choice is not None:
            cluster.take(choice[0], task, choice[1])
    return round(1000 * spent / QUEUE, 3)


def place_ms(nodes: list[Node], pods: list[Pod], seed: int, count: int = 200) -> float:
    """Mean time of one `placement.place` call on all nodes as candidates (machines with
    their GPUs, CPUs and memory, and the jobs placed so far), for `count` tasks drawn from the
    trace (shares of a GPU as `share:`), placed one after the other."""
    from dstack_plan.config.resources import ResourcesSpec
    from dstack_plan.providers.base import GPU, MachineResources
    from dstack_plan.scheduler.placement import Candidate, JobDemand, held_by, place

    rng = random.Random(seed + 2)
    candidates = [
        Candidate(
            "trace",
            "ssh",
            node.name,
            MachineResources(
                cpus=node.cpu // 1000,
                memory_gb=node.memory / 1024,
                disk_gb=1000,
                gpus=tuple(
                    GPU(vendor="nvidia", name=node.model, index=i) for i in range(node.gpus)
                ),
            ),
        )
        for node in nodes
    ]
    spent = 0.0
    for number in range(count):
        pod = rng.choice(pods)
        gpu: dict[str, object] = {"count": pod.gpus}
        if pod.gpus == 1 and pod.gpu_milli < WHOLE:
            gpu["share"] = pod.gpu_milli / WHOLE
        if pod.models and pod.gpus:
            gpu["name"] = sorted(pod.models)
        spec = ResourcesSpec.model_validate(
            {
                "cpu": f"{max(pod.cpu // 1000, 1)}..",
                "memory": f"{max(pod.memory // 1024, 1)}GB..",
                "gpu": gpu,
            }
        )
        job = JobDemand(f"task {number}", spec)
        began = time.perf_counter()
        decision = place([job], candidates, distinct=False)
        spent += time.perf_counter() - began
        if decision.placed:
            host = decision.hosts[0]
            index = next(i for i, c in enumerate(candidates) if c.host == host.host)
            busy = (*host.busy, held_by(job, job.label, host.resources.gpus))
            candidates[index] = host._replace(busy=busy)
    return round(1000 * spent / count, 3)


def run(nodes_file: Path, pods_file: Path, seed: int, speedup: float = 1.0) -> dict:
    """Every experiment, in the shape `--json` prints."""
    nodes, pods = load_nodes(nodes_file), load_pods(pods_file)
    return {
        "inflation": {
            "whole": inflation(nodes, pods, seed, shared=False),
            "shared": inflation(nodes, pods, seed, shared=True),
        },
        "replay": replay(nodes, pods, seed, speedup),
        "decision_ms": decision_ms(nodes, pods, seed),
        "place_ms": place_ms(nodes, pods, seed),
    }


def verdict(result: dict) -> tuple[bool, str]:
    """Target: at 100% and 110%, ours within 0.5 points of the best baseline, both modes."""
    worst = -1e9
    for mode in ("whole", "shared"):
        table = result["inflation"][mode]
        for level in ("100", "110"):
            best = min(v[level] for k, v in table.items() if k != "ours")
            worst = max(worst, table["ours"][level] - best)
    ok = worst <= 0.5 and result["decision_ms"] < 2
    text = (
        f"ours vs best baseline at 100/110%: {worst:+.2f} points (target <= +0.5); "
        f"decision {result['decision_ms']:.3f} ms (target < 2 ms): {'OK' if ok else 'MISSED'}"
    )
    return ok, text


def render(result: dict) -> str:
    lines = []
    for mode in ("whole", "shared"):
        lines.append(f"inflation, {mode} GPUs: unallocated GPU capacity (%) at arrived workload")
        lines.append(f"  {'policy':<12}" + "".join(f"{lv:>8}%" for lv in LEVELS))
        for name, row in result["inflation"][mode].items():
            lines.append(f"  {name:<12}" + "".join(f"{row[str(lv)]:>9.2f}" for lv in LEVELS))
    if result["replay"]:
        lines.append("replay in time order (shared GPUs)")
        lines.append(f"  {'policy':<12}{'mean delay s':>14}{'p95 delay s':>14}{'GPU alloc %':>13}")
        for name, row in result["replay"].items():
            cells = [row["mean_delay_s"], row["p95_delay_s"], row["mean_gpu_alloc_pct"]]
            lines.append(
                f"  {name:<12}" + "".join(f"{'-' if c is None else c:>14}" for c in cells)
            )
    lines.append(f"decision time (ours, all nodes, {QUEUE} queued): {result['decision_ms']} ms")
    lines.append(f"placement.place on all nodes, with reasons: {result['place_ms']} ms a decision")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--replay-speedup",
        type=float,
        default=1.0,
        help="compress the time between arrivals in the replay by this factor (default 1: "
        "the trace's own times)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.nodes, args.pods, args.seed, args.replay_speedup)
    if args.json:
        for row in result["replay"].values():
            row.pop("never_started", None)
        print(json.dumps(result))
        return 0
    ok, text = verdict(result)
    print(render(result))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
