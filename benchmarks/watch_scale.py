"""`dstack watch` at scale: tick duration and CPU with 1,000 running jobs on 50 agents, and the
time a standby takes to act after the leader is SIGKILLed.

    python benchmarks/watch_scale.py [--agents 50] [--jobs 1000] [--ticks 6] [--interval 5]

Needs root: the agents run on namespace hosts of one SSH fleet (benchmarks/fanout_hosts.py,
network `br-dpbench`), each host running the real agent. One `dstack apply -y` creates the
fleet (`placement: cluster`) and `jobs / agents` tasks of `nodes: <agents>` running
`sleep 3600` as process jobs (no image): multi-node tasks, so that every host gets the same
share (the scheduler puts single-node tasks without GPUs first-fit on the first host). Beside
them one task `finisher` waits for a flag file.

Ticks: a Watcher in this process (Project + lease + event log + metrics, as `dstack watch`
builds them; real clock) ticks every `--interval` seconds; tick 0 warms up (it opens the SSH
connections) and is not counted. Per tick: wall time, and process CPU time
(`time.process_time`, threads included) from its start to the next tick's start, less the
benchmark's own reading of the hosts' CPU (done right after each tick), as a share of one core
over the interval. Targets: median tick < 1 s, CPU < 10% of one core.

Takeover: two `dstack watch --interval 1s` processes on the state; the leader (the pid in
`.dstack/watch-lease.json`) gets SIGKILL, the flag file is created at once (the finisher's
job ends), and the time runs until the standby's pid is in the lease and the finisher is
`done` in state: both need the standby to lead. Target < 30 s.

A missed tick or CPU target is followed by each step of a tick timed on its own (wall, CPU)
and a cProfile of one tick (both also with `--profile`). Everything
(watch processes, agents, jobs, namespaces, files) is removed at the end, also on Ctrl-C.
Exit code 0 when every target was met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import fanout_hosts
from fanout_hosts import Bench, bench, write_project

from dstack_plan.apply.handlers import ResourceHandler
from dstack_plan.apply.records import for_handler
from dstack_plan.cli.watch_cmd import LEASE_TTL
from dstack_plan.project import Project
from dstack_plan.runs.handler import RunHandler
from dstack_plan.runs.records import RunRecord
from dstack_plan.state.events import EventLog
from dstack_plan.state.lease import LEASE_RECORD, LeaderLease, new_holder_id
from dstack_plan.state.model import ResourceState
from dstack_plan.watch.loop import Watcher
from dstack_plan.watch.metrics import WatchMetrics
from dstack_plan.watch.model import TickReport

T = TypeVar("T")

TICK_TARGET, CPU_TARGET, TAKEOVER_TARGET = 1.0, 10.0, 30.0
FINISHER = "task.finisher"
READY_TIMEOUT = 300.0
"""Seconds the warm-up waits for every job to be reported running."""


@dataclass
class Layout:
    agents: int
    tasks: int
    nodes: int

    @property
    def jobs(self) -> int:
        return self.tasks * self.nodes


def write_runs(project: Path, layout: Layout, flag: Path) -> None:
    """The sleeping tasks and the finisher, in one file of several documents."""
    common = (
        "fleets: [bench]\nstop_duration: 1s\nresources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}\n"
    )
    docs = [
        f'type: task\nname: sleep-{i}\nnodes: {layout.nodes}\ncommands: ["sleep 3600"]\n{common}'
        for i in range(layout.tasks)
    ]
    wait = f"while [ ! -e {flag} ]; do sleep 0.2; done"
    docs.append(f"type: task\nname: finisher\ncommands: [{json.dumps(wait)}]\n{common}")
    (project / "runs.dstack.yml").write_text("---\n".join(docs))


def apply(b: Bench, project: Path) -> float:
    """Wall seconds of the one `dstack apply -y` of the fleet and every task."""
    started = time.perf_counter()
    done = subprocess.run(
        [str(fanout_hosts.DSTACK), "apply", "-y", str(project)],
        env=b.env,
        cwd=b.work,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        sys.exit(f"dstack apply failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - started


def running_sleepers(report: TickReport) -> int:
    return sum(1 for j in report.jobs if j.status == "running" and j.address != FINISHER)


@dataclass
class TickTimes:
    wall: list[float]
    cpu: list[float]
    """CPU seconds from a tick's start to the next one's (the tick and the wait after it)."""
    others_cpu: list[float] = field(default_factory=list)
    """CPU seconds of the hosts' processes (agents, sshd, jobs) over each interval."""
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    """(step of a tick, wall s, CPU s of this process), each step done on its own."""
    profile: str | None = None


async def measure_ticks(
    project: Project,
    hosts: Sequence[str],
    layout: Layout,
    ticks: int,
    interval: float,
    profile: bool,
) -> TickTimes:
    """Warm up (until every job runs), then `ticks` ticks every `interval` seconds; one more
    under cProfile with `profile` or when a target was missed."""
    lease = LeaderLease(project.backend, new_holder_id(), ttl=LEASE_TTL, clock=project.clock)
    events = EventLog(project.backend, secret_guard=project.guard)
    metrics = WatchMetrics()
    watcher = Watcher(
        project, lease=lease, events=events, reporters=[lambda t, c: metrics.observe(t)]
    )
    clock = project.clock
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:  # warm-up: SSH connections opened, jobs started
            report = await watcher.tick()
            if not report.leader:
                sys.exit("the benchmark's watcher did not get the lease")
            if running_sleepers(report) == layout.jobs:
                break
            if time.monotonic() > deadline:
                sys.exit(f"{running_sleepers(report)} of {layout.jobs} jobs running")
            await clock.sleep(1.0)
        await clock.sleep(interval)
        times = TickTimes([], [])
        others_started = hosts_cpu(hosts)
        for _ in range(ticks):
            started, cpu_started = time.perf_counter(), time.process_time()
            report = await watcher.tick()
            times.wall.append(time.perf_counter() - started)
            if running_sleepers(report) != layout.jobs:
                sys.exit(f"{running_sleepers(report)} of {layout.jobs} jobs running mid-way")
            ticked = time.process_time()
            # Reading the hosts' CPU forks `ip` once per host: the benchmark's own cost, left
            # out of the watch's, and done right after a tick so it does not slow the next.
            others_now = hosts_cpu(hosts)
            times.others_cpu.append(others_now - others_started)
            others_started, sampled = others_now, time.process_time()
            await clock.sleep(max(0.0, started + interval - time.perf_counter()))
            times.cpu.append(ticked - cpu_started + time.process_time() - sampled)
        if profile or not all(ticks_met(times, interval)):
            times.phases = await tick_phases(watcher)
            times.profile = await profiled_tick(watcher)
        return times
    finally:
        await asyncio.to_thread(lease.release)


def hosts_cpu(namespaces: Sequence[str]) -> float:
    """CPU seconds (user + system) the processes now in `namespaces` have used: the agents,
    sshd and the jobs; what died since is not counted (the hosts start nothing new here).
    One pass over /proc, matching each process's network namespace: `ip netns pids` per
    namespace scans every process once per host, seconds of CPU that slowed the next tick."""
    wanted = set()
    for netns in namespaces:
        with contextlib.suppress(OSError):
            wanted.add(os.stat(f"/run/netns/{netns}").st_ino)
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino not in wanted:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks_per_s


async def tick_phases(watcher: Watcher) -> list[tuple[str, float, float]]:
    """The steps of a tick (loop.Watcher.tick, Project.refresh), each timed on its own: wall
    and this process's CPU seconds; and one host's job listing alone."""
    project = watcher.project
    rows: list[tuple[str, float, float]] = []

    async def timed(name: str, step: Callable[[], Awaitable[T]]) -> T:
        wall, cpu = time.perf_counter(), time.process_time()
        result = await step()
        rows.append((name, time.perf_counter() - wall, time.process_time() - cpu))
        return result

    lease = watcher.lease
    assert lease is not None
    await timed("lease renew", lambda: asyncio.to_thread(lease.acquire_or_renew))
    snapshot = await timed("state read", lambda: asyncio.to_thread(project.backend.read))
    state = snapshot.state
    ctx = project.context(state)
    batches: dict[str, tuple[ResourceHandler, list[ResourceState]]] = {}
    handlers = project.handlers()
    for current in state.resources.values():
        handler = handlers[current.kind]
        kind = "runs" if isinstance(handler, RunHandler) else current.kind
        batches.setdefault(kind, (handler, []))[1].append(for_handler(current))
    for kind, (handler, currents) in batches.items():
        n = len(currents)
        await timed(f"refresh: {n} {kind}", partial(handler.refresh_many, currents, ctx))
    await timed("refresh (all of it, as a tick)", partial(project.refresh, snapshot))
    runs = next((h for h, _ in batches.values() if isinstance(h, RunHandler)), None)
    host = next(j.host for r in state.resources.values() for j in RunRecord.of(r).jobs)
    if runs is not None:  # what one agent's answer costs: the runs refresh asks them in turn
        await timed("one host's job listing", partial(runs._listing, "bench", host, state))
    await timed("host metrics, every host", partial(watcher._hosts, state))
    return rows


async def profiled_tick(watcher: Watcher) -> str:
    """One tick under cProfile (this thread: the event loop), the top of it as text."""
    profiler = cProfile.Profile()
    profiler.enable()
    await watcher.tick()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)
    return out.getvalue()


def run_ticks(b: Bench, directory: Path, layout: Layout, args: argparse.Namespace) -> TickTimes:
    """The tick half, in this process."""
    os.environ.update(b.env)  # the agent dir, HOME without known_hosts: as the CLI sees them
    os.environ.pop("SSH_AUTH_SOCK", None)
    project = Project(directory)
    namespaces = [b.network[name].netns for name in b.names]

    async def main() -> TickTimes:
        try:
            return await measure_ticks(
                project, namespaces, layout, args.ticks, args.interval, args.profile
            )
        finally:
            await project.close()

    return asyncio.run(main())


def ticks_met(times: TickTimes, interval: float) -> tuple[bool, bool]:
    """Whether the median tick and the average CPU share met their targets."""
    cpu = statistics.mean(100 * c / interval for c in times.cpu)
    return statistics.median(times.wall) < TICK_TARGET, cpu < CPU_TARGET


def lease_pid(directory: Path) -> int | None:
    try:
        return int(json.loads((directory / ".dstack" / LEASE_RECORD).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def run_status(directory: Path, address: str) -> str | None:
    try:
        state = json.loads((directory / ".dstack" / "state.json").read_text())
    except (OSError, ValueError):
        return None  # mid-rename
    return str(state["resources"].get(address, {}).get("status"))


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            sys.exit(f"takeover: {what} within {timeout:g} s")
        time.sleep(0.1)
    return time.monotonic() - started


def measure_takeover(b: Bench, directory: Path, flag: Path) -> tuple[float, float]:
    """Seconds from the leader's SIGKILL to the standby's pid in the lease, and to the
    finisher `done` in state (committed by the standby, now leading)."""
    watches: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        argv = [str(fanout_hosts.DSTACK), "watch", str(directory), "--interval", "1s"]
        argv += ["--metrics-file", str(b.work / f"{name}.prom")]
        with open(b.work / f"{name}.log", "wb") as log:
            watch = subprocess.Popen(argv, env=b.env, cwd=b.work, stdout=log, stderr=log)
        watches.append(watch)
        return watch

    try:
        leader = start("leader")
        wait_until(lambda: lease_pid(directory) == leader.pid, 120, "the first watch never led")
        standby = start("standby")
        # warm: it has ticked (opened its connections), and then once more
        wait_until(lambda: (b.work / "standby.prom").exists(), 120, "the standby never ticked")
        time.sleep(2)
        if lease_pid(directory) != leader.pid:
            sys.exit("takeover: the standby took a live lease")
        if run_status(directory, FINISHER) != "running":
            sys.exit(f"takeover: {FINISHER} is {run_status(directory, FINISHER)}, not running")
        leader.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        flag.touch()
        leader.wait(10)
        wait_until(lambda: lease_pid(directory) == standby.pid, 120, "no takeover")
        leads = time.monotonic() - killed
        wait_until(lambda: run_status(directory, FINISHER) == "done", 120, "no commit")
        return leads, time.monotonic() - killed
    finally:
        for watch in watches:
            if watch.poll() is None:
                watch.send_signal(signal.SIGINT)
        for watch in watches:
            try:
                watch.wait(15)
            except subprocess.TimeoutExpired:
                watch.kill()
                watch.wait()


def report(
    layout: Layout,
    args: argparse.Namespace,
    applied: float,
    times: TickTimes,
    takeover: tuple[float, float],
) -> dict[str, bool]:
    """Print the table (and the profile, if taken) and the headline; target -> met."""
    leads, takeover_s = takeover
    median_tick, max_tick = statistics.median(times.wall), max(times.wall)
    cpu_share = [100 * c / args.interval for c in times.cpu]
    cpu = statistics.mean(cpu_share)
    print(
        f"watch: {layout.agents} agents, {layout.jobs} running jobs ({layout.tasks} tasks x "
        f"{layout.nodes} nodes), {args.ticks} ticks every {args.interval:g} s after a warm-up"
    )
    print("{:<34} {:>9} {:>9} {:>9}".format("measure", "median", "min", "max"))
    others = [100 * c / args.interval for c in times.others_cpu]
    rows = [
        ("tick wall s", times.wall),
        ("CPU s per interval", times.cpu),
        ("CPU % of one core", cpu_share),
        ("hosts' CPU % (agents, sshd, jobs)", others),
    ]
    for name, values in rows:
        print(
            f"{name:<34} {statistics.median(values):>9.3f} {min(values):>9.3f} {max(values):>9.3f}"
        )
    print(f"{'apply of everything s (once)':<34} {applied:>9.1f}")
    print(f"{'takeover: SIGKILL -> standby leads s':<34} {leads:>9.1f}")
    print(f"{'takeover: SIGKILL -> it committed s':<34} {takeover_s:>9.1f}")
    if times.phases:
        print("\nthe steps of one tick, each on its own:")
        print("{:<34} {:>9} {:>9}".format("step", "wall s", "CPU s"))
        for name, wall, cpu_s in times.phases:
            print(f"{name:<34} {wall:>9.3f} {cpu_s:>9.3f}")
    if times.profile is not None:
        print("\nwhere the time of one tick goes (cProfile, event-loop thread):")
        print(times.profile)
    met = {
        f"tick < {TICK_TARGET:g} s": median_tick < TICK_TARGET,
        f"CPU < {CPU_TARGET:g}%": cpu < CPU_TARGET,
        f"takeover < {TAKEOVER_TARGET:g} s": takeover_s < TAKEOVER_TARGET,
    }
    verdict = ["PASS" if ok else "FAIL" for ok in met.values()]
    print(
        f"watch_scale: {layout.agents} agents, {layout.jobs} jobs: tick {median_tick:.3f} s "
        f"(max {max_tick:.3f}, target < {TICK_TARGET:g} s) {verdict[0]}, CPU avg {cpu:.1f}% of a "
        f"core (target < {CPU_TARGET:g}%) {verdict[1]}, takeover {takeover_s:.1f} s "
        f"(target < {TAKEOVER_TARGET:g} s) {verdict[2]}"
    )
    return met


def main() -> int:
    parser = argparse.ArgumentParser(
        description=" ".join((__doc__ or "").split("\n\n")[0].split())
    )
    parser.add_argument("--agents", type=int, default=50, help="hosts/agents (default 50)")
    parser.add_argument("--jobs", type=int, default=1000, help="running jobs (default 1000)")
    parser.add_argument("--ticks", type=int, default=6, help="measured ticks (default 6)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--profile", action="store_true", help="cProfile one tick anyway")
    args = parser.parse_args()
    if args.agents < 1 or args.jobs < args.agents or args.ticks < 1 or args.interval <= 0:
        parser.error("needs agents >= 1, jobs >= agents, ticks >= 1, interval > 0")
    layout = Layout(args.agents, args.jobs // args.agents, args.agents)
    with bench(args.agents, ansible=False, prefix="dstack-watch-") as b:
        flag = b.work / "finish.flag"
        project = write_project(b.work / "project", b.key, b.addresses(args.agents), "cluster")
        write_runs(project, layout, flag)
        print(f"applying the fleet and {layout.tasks + 1} tasks ...", flush=True)
        applied = apply(b, project)
        print(f"applied in {applied:.1f} s; measuring ticks ...", flush=True)
        times = run_ticks(b, project, layout, args)
        print("measuring the takeover ...", flush=True)
        takeover = measure_takeover(b, project, flag)
        print()
        met = report(layout, args, applied, times, takeover)
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the hosts are gone already: `bench()` cleaned up
        sys.exit("interrupted")
