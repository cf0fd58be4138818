"""The host half of benchmarks/scale.py, on namespace hosts (benchmarks/fanout_hosts.py):

- fleet create: a fresh `dstack apply -y` of an SSH fleet of N hosts (no agent, no state)
  against `ansible all -m setup` on the same hosts, alternating round by round, as
  benchmarks/fanout_apply.py does (it is reused: `ApplyHalf` with those two sides only);
- a watch tick over J running jobs on A agents, as benchmarks/watch_scale.py measures it (its
  apply, its Watcher in this process, its tick and CPU figures; no takeover).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
from dataclasses import dataclass

import watch_scale
from fanout_apply import ANSIBLE, FRESH, ApplyHalf
from fanout_hosts import Bench, Check, print_table, write_project
from scale_tasks import progress


class FleetCreate(ApplyHalf):
    """fanout_apply's apply half with its fresh apply and `ansible -m setup` only."""

    def sides(self) -> dict[str, tuple[list[str], dict[str, str], Check]]:
        every = super().sides()
        return {side: every[side] for side in (FRESH, ANSIBLE)}


def fleet_create(b: Bench, hosts: int, rounds: int) -> dict[str, float]:
    """Fresh apply and `ansible -m setup` on the first `hosts` hosts, a warm-up round and then
    `rounds` alternating ones; prints the table (and, when the apply is the slower, where
    its time goes); side -> median seconds. Leaves the hosts as it found them: no agent, no
    claim, no state."""
    progress(f"fleet create of {hosts} hosts against ansible -m setup, {rounds} rounds ...")
    half = FleetCreate(b, hosts)
    try:
        times = half.run(rounds)
        title = f"fleet create of {hosts} hosts, median of {rounds} alternating rounds"
        medians = print_table(title, times, [ANSIBLE])
        if medians[FRESH] > medians[ANSIBLE]:  # slower: where its time goes, as fanout.py says
            half.explain(FRESH)
        print()
        return medians
    finally:
        half.make_fresh()  # stops the agents, removes their dirs (and claims) and the state
        # ApplyHalf's directories have fixed names: the next size makes them anew
        shutil.rmtree(b.work / "apply-project", ignore_errors=True)
        shutil.rmtree(b.work / "apply-ansible", ignore_errors=True)


@dataclass
class WatchResult:
    agents: int
    jobs: int
    applied: float
    ticks: list[float]
    cpu_share: list[float]
    """Per interval: this process's CPU seconds / interval, in % of one core."""
    tick_ok: bool
    cpu_ok: bool


def watch_tick(b: Bench, jobs: int, agents: int, ticks: int, interval: float) -> WatchResult:
    """One apply of a fleet of `agents` hosts and `jobs // agents` tasks of `nodes: agents`
    (`sleep 3600`), then benchmarks/watch_scale.py's ticks; prints the table."""
    layout = watch_scale.Layout(agents, jobs // agents, agents)
    project = write_project(b.work / "watch-project", b.key, b.addresses(agents), "cluster")
    watch_scale.write_runs(project, layout, b.work / "watch-finish.flag")
    progress(f"watch: applying a fleet of {agents} hosts and {layout.jobs:,} jobs ...")
    applied = watch_scale.apply(b, project)
    progress(f"watch: applied in {applied:.1f} s; {ticks} ticks every {interval:g} s ...")
    saved = dict(os.environ)  # run_ticks takes the bench's environment, as the CLI would
    try:
        options = argparse.Namespace(ticks=ticks, interval=interval, profile=False)
        times = watch_scale.run_ticks(b, project, layout, options)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    tick_ok, cpu_ok = watch_scale.ticks_met(times, interval)
    result = WatchResult(
        agents,
        layout.jobs,
        applied,
        times.wall,
        [100 * c / interval for c in times.cpu],
        tick_ok,
        cpu_ok,
    )
    print_watch(result, interval)
    if times.phases:  # a target was missed: watch_scale timed each step of a tick
        print("the steps of one tick, each on its own (watch_scale.py --profile for more):")
        print("{:<34} {:>9} {:>9}".format("step", "wall s", "CPU s"))
        for name, wall, cpu in times.phases:
            print(f"{name:<34} {wall:>9.3f} {cpu:>9.3f}")
        print()
    return result


def print_watch(result: WatchResult, interval: float) -> None:
    print(
        f"watch tick over {result.jobs:,} running jobs on {result.agents} agents, "
        f"{len(result.ticks)} ticks every {interval:g} s"
    )
    print("{:<22} {:>9} {:>9} {:>9}".format("measure", "median", "min", "max"))
    for name, values in (("tick wall s", result.ticks), ("CPU % of one core", result.cpu_share)):
        low, high = min(values), max(values)
        print(f"{name:<22} {statistics.median(values):>9.3f} {low:>9.3f} {high:>9.3f}")
    print(f"{'apply of everything s':<22} {result.applied:>9.1f}")
    print()
