"""dstack-plan at scale, whole processes: apply, no-op plan and destroy of 1,000 to 10,000
trivial tasks on the local fleet and on 50 SSH hosts, fleet create against Ansible, a watch
tick over 10,000 jobs, and Terraform's apply beside ours (issue 36).

    python benchmarks/scale.py [--local-sizes 1000 3000 10000] [--ssh-sizes 1000 3000 10000]
        [--hosts 50] [--fleet-sizes 50 100] [--repeats 3] [--plans 3] [--rounds 1]
        [--watch-jobs 10000] [--watch-agents 100] [--watch-ticks 6] [--watch-interval 5]
        [--terraform-sizes 1000 3000]

Every section runs by default at the issue's sizes; an empty list (`--ssh-sizes` alone) or 0
skips one. A quick check: `--local-sizes 50 100 --ssh-sizes 0 --fleet-sizes 3 --watch-jobs 40
--watch-agents 4 --terraform-sizes 50 100`. The SSH sections need root (namespace hosts running
sshd, made as benchmarks/fanout_hosts.py makes them: network `br-dpbench`, or copy K under
`DSTACK_PLAN_SSH_TEST_SLOT=K`) and the fleet section ansible-core in the venv.

Tasks (benchmarks/scale_tasks.py): per size, smallest first, the local fleet's cycle, then
Terraform's apply of as many `terraform_data` (where `terraform` is on PATH), then the SSH
fleet's cycle: the sides alternate, one after the other (10,000 process jobs take 10,000
to 20,000 pids, their agent's threads as many more; pid_max here is 32,768). A cycle:
`dstack apply -y` of N tasks (`sleep 3600`, one process job each) in a project of their own;
untimed, until `dstack ps` says all run; `--plans` no-op `dstack plan --detailed-exitcode`;
`dstack destroy -y` (on the SSH fleet `--target` every task: the fleet stays, so every apply
lands on warm hosts). Wall and CPU seconds of each process, its bytecode cached as an
installed package's is; the local agent runs on a data dir of the benchmark's own
(`DSTACK_PLAN_AGENT_DIR`), started by a one-task warm-up cycle, stopped at the end.
`--rounds K` runs every size K times, the sizes alternating (1,000, 10,000, 1,000, ...), and
reports medians: on a VM whose speed drifts by tens of percent, a growth ratio from one round
compares two different machines.

Hosts (benchmarks/scale_hosts.py): fleet create of N hosts against `ansible all -m setup`
(benchmarks/fanout_apply.py's fresh apply, `--repeats` alternating rounds after a warm-up);
a watch tick over J jobs on A agents (benchmarks/watch_scale.py's apply and ticks).

Targets, each checked where its section and size ran:
- from the smallest size to the largest, every command grows at most 1.1x the sizes' ratio
  (11x from 1,000 to 10,000), on each side;
- apply of 10,000 tasks on the local fleet < 90 s; of 1,000 onto the warm SSH hosts < 10 s
  (more than 3x Slurm's sustained submission rate);
- a no-op plan of 10,000 running runs < 3 s, as a whole process, on each side;
- a fleet create no slower than `ansible -m setup` on the same hosts (at the smallest fleet
  size run: 50 by default);
- a watch tick < 1 s and < 10% of one core.
Terraform's apply is reported, not a target: where `terraform` is not on PATH, the 34.3 s
measured here for 1,000 `terraform_data` is cited instead.

Prints a table per section, the targets with PASS/FAIL each and a last line with the count.
Everything it started (agents by their pid files, namespaces, temporary dirs) is removed at
the end, also on Ctrl-C or SIGTERM. Exit code 0 when every target checked was met, else 1.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import fanout_hosts
import scale_hosts
from fanout_hosts import bench
from scale_tasks import (
    APPLY,
    COMMANDS,
    PLAN,
    Results,
    SSHTaskSide,
    TaskSide,
    default_env,
    local_env,
    median,
    progress,
    sizes_run,
    stop_local_agent,
    terraform_apply,
)

GROWTH_SLACK = 1.1
"""A command may grow 1.1x as fast as the number of tasks: 11x from 1,000 to 10,000."""
LOCAL_APPLY_TARGET = (10_000, 90.0)
SSH_APPLY_TARGET = (1_000, 10.0)
PLAN_TARGET = (10_000, 3.0)
TERRAFORM_CITED = (1_000, 34.3)
"""Terraform's apply of 1,000 `terraform_data`, measured on this kind of machine (issue 36)."""


@dataclass(frozen=True)
class Target:
    name: str
    ok: bool
    measured: str


def sizes(values: list[int]) -> list[int]:
    return sorted({v for v in values if v > 0})


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=" ".join((__doc__ or "").split("\n\n")[0].split())
    )

    def sizes_flag(flag: str, default: list[int], what: str) -> None:
        parser.add_argument(flag, type=int, nargs="*", default=default, help=what)

    sizes_flag("--local-sizes", [1_000, 3_000, 10_000], "tasks on the local fleet")
    sizes_flag("--ssh-sizes", [1_000, 3_000, 10_000], "tasks on the SSH fleet")
    parser.add_argument("--hosts", type=int, default=50, help="SSH hosts of the task cycles")
    sizes_flag("--fleet-sizes", [50, 100], "hosts of a fleet create against Ansible")
    parser.add_argument("--repeats", type=int, default=3, help="fleet create rounds (3)")
    parser.add_argument("--plans", type=int, default=3, help="no-op plans per size (3)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="task cycles per size, sizes alternating (1)"
    )
    parser.add_argument("--watch-jobs", type=int, default=10_000, help="0 skips the watch")
    parser.add_argument("--watch-agents", type=int, default=100)
    parser.add_argument("--watch-ticks", type=int, default=6)
    parser.add_argument("--watch-interval", type=float, default=5.0, help="seconds")
    sizes_flag("--terraform-sizes", [1_000, 3_000], "terraform_data applied (if on PATH)")
    args = parser.parse_args()
    for name in ("local_sizes", "ssh_sizes", "fleet_sizes", "terraform_sizes"):
        setattr(args, name, sizes(getattr(args, name)))
    if args.ssh_sizes and args.hosts < 1:
        parser.error("--hosts must be at least 1")
    if args.watch_jobs > 0 and not 1 <= args.watch_agents <= args.watch_jobs:
        parser.error("the watch needs 1 <= --watch-agents <= --watch-jobs")
    if min(args.repeats, args.plans, args.rounds, args.watch_ticks) < 1:
        parser.error("--repeats, --plans, --rounds and --watch-ticks must be >= 1")
    if args.watch_interval <= 0:
        parser.error("--watch-interval must be > 0")
    return args


@contextmanager
def local_work() -> Iterator[Path]:
    """A temporary dir for the local side and Terraform; at the end the local agent is
    stopped (its jobs with it) and the dir removed, a second Ctrl-C notwithstanding."""
    work = Path(tempfile.mkdtemp(prefix="dstack-scale-"))
    try:
        yield work
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            stop_local_agent(work / "local-agent")
        finally:
            shutil.rmtree(work, ignore_errors=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)


def warn_of_pids(args: argparse.Namespace) -> None:
    """A process job is 2 pids (`sh -c`, `sleep`): say so when the largest section's jobs
    and the processes running now may not fit in pid_max (threads take pids too)."""
    jobs = max([*args.local_sizes, *args.ssh_sizes, args.watch_jobs])
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    running = sum(1 for proc in Path("/proc").iterdir() if proc.name.isdigit())
    if running + 2 * jobs > 0.9 * pid_max:
        progress(
            f"warning: {jobs:,} process jobs take about {2 * jobs:,} pids, {running:,} "
            f"processes run already and pid_max is {pid_max:,}"
        )


def hosts_needed(args: argparse.Namespace) -> int:
    return max(
        args.hosts if args.ssh_sizes else 0,
        max(args.fleet_sizes, default=0),
        args.watch_agents if args.watch_jobs > 0 else 0,
    )


def run_tasks(
    args: argparse.Namespace, work: Path, b: fanout_hosts.Bench | None, results: Results
) -> None:
    """The sizes in turn, smallest first: local, Terraform, SSH."""
    env = local_env(b.env if b is not None else default_env(work), work / "local-agent")
    local = TaskSide(work, env)
    if args.local_sizes:
        local.cycle(1, 1, {})  # warm-up: starts the local agent, fills the page cache
    ssh = SSHTaskSide(b, args.hosts, env) if b is not None and args.ssh_sizes else None
    terraform = shutil.which("terraform") is not None
    everything = sorted({*args.local_sizes, *args.ssh_sizes, *args.terraform_sizes})
    for n in everything * args.rounds:
        if n in args.local_sizes:
            local.cycle(n, args.plans, results)
        if n in args.terraform_sizes and terraform:
            terraform_apply(work, n, env, results)
        if ssh is not None and n in args.ssh_sizes:
            ssh.cycle(n, args.plans, results)
    if ssh is not None:
        ssh.close()


def print_tasks(results: Results, side: str) -> None:
    print(f"{side}: N trivial tasks (sleep 3600), each command a whole `dstack` process")
    print("(kernel s: CPU the kernel's own threads used meanwhile, e.g. a memory monitor)")
    header = ("command", "tasks", "wall s", "CPU s", "kernel s", "growth")
    print("{:<11} {:>7} {:>9} {:>9} {:>9}  {}".format(*header))
    for command in COMMANDS:
        by_size = results[(side, command)]
        low, high = min(by_size), max(by_size)
        for n in sorted(by_size):
            m = median(by_size[n])
            growth = ""
            if n == high and high > low:
                first = median(by_size[low])
                cpu = f"{m.cpu / first.cpu:.1f}x" if first.cpu > 0 else "-"
                growth = f"{m.wall / first.wall:.1f}x for {high / low:g}x tasks (CPU {cpu})"
            print(f"{command:<11} {n:>7,} {m.wall:>9.3f} {m.cpu:>9.3f} {m.kernel:>9.3f}  {growth}")
    print()


def print_terraform(results: Results, sides: list[str]) -> None:
    measured = results.get(("terraform", APPLY), {})
    if not measured:
        n, seconds = TERRAFORM_CITED
        print(f"terraform is not on PATH: its apply of {n:,} terraform_data took {seconds} s here")
        for side in sides:
            if n in results.get((side, APPLY), {}):
                ours = median(results[(side, APPLY)][n]).wall
                print(f"  dstack apply of {n:,} tasks, {side}: {ours:.3f} s")
        print()
        return
    print("apply beside Terraform's (terraform_data, no provider: its own overhead only)")
    header = "{:>7} {:>12}".format("tasks", "terraform s")
    print(header + "".join(f" {side + ' s':>20} {'x terraform':>11}" for side in sides))
    for n in sorted(measured):
        theirs = median(measured[n]).wall
        row = f"{n:>7,} {theirs:>12.3f}"
        for side in sides:
            if n in results.get((side, APPLY), {}):
                ours = median(results[(side, APPLY)][n]).wall
                row += f" {ours:>20.3f} {ours / theirs:>11.2f}"
            else:
                row += f" {'-':>20} {'-':>11}"
        print(row)
    print()


def task_targets(results: Results, side: str) -> list[Target]:
    targets = []
    done = sizes_run(results, side)
    if len(done) >= 2:
        low, high = done[0], done[-1]
        allowed = GROWTH_SLACK * high / low
        for command in COMMANDS:
            walls = results[(side, command)]
            ratio = median(walls[high]).wall / median(walls[low]).wall
            name = f"{side}: {command} grows <= {allowed:.3g}x from {low:,} to {high:,} tasks"
            targets.append(Target(name, ratio <= allowed, f"{ratio:.2f}x"))
    limits = [(APPLY, *(LOCAL_APPLY_TARGET if side == "local" else SSH_APPLY_TARGET))]
    limits.append((PLAN, *PLAN_TARGET))
    for command, n, seconds in limits:
        if n in results[(side, command)]:
            wall = median(results[(side, command)][n]).wall
            name = f"{side}: {command} of {n:,} tasks < {seconds:g} s"
            targets.append(Target(name, wall < seconds, f"{wall:.2f} s"))
    return targets


def fleet_targets(medians: dict[int, dict[str, float]]) -> list[Target]:
    if not medians:
        return []
    hosts = min(medians)
    fresh, setup = medians[hosts][scale_hosts.FRESH], medians[hosts][scale_hosts.ANSIBLE]
    name = f"fleet create of {hosts} hosts <= ansible -m setup"
    return [Target(name, fresh <= setup, f"{fresh:.2f} s vs {setup:.2f} s")]


def watch_targets(watch: scale_hosts.WatchResult | None) -> list[Target]:
    if watch is None:
        return []
    where = f"{watch.jobs:,} jobs on {watch.agents} agents"
    tick, cpu = statistics.median(watch.ticks), statistics.mean(watch.cpu_share)
    return [
        Target(f"watch tick over {where} < 1 s", watch.tick_ok, f"median {tick:.3f} s"),
        Target(f"watch CPU over {where} < 10% of a core", watch.cpu_ok, f"avg {cpu:.1f}%"),
    ]


def report(targets: list[Target]) -> int:
    print("targets:" if targets else "targets: none applies to the sizes run")
    for t in targets:
        print(f"  {'PASS' if t.ok else 'FAIL'}  {t.name}: {t.measured}")
    missed = [t.name for t in targets if not t.ok]
    print(
        f"scale: {len(targets) - len(missed)} of {len(targets)} targets met"
        + (f"; missed: {'; '.join(missed)}" if missed else "")
    )
    return 1 if missed else 0


def main() -> int:
    args = parse()

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    warn_of_pids(args)
    results: Results = {}
    fleets: dict[int, dict[str, float]] = {}
    watch: scale_hosts.WatchResult | None = None
    with ExitStack() as stack:
        work = stack.enter_context(local_work())
        b = None
        if hosts_needed(args):
            reason = fanout_hosts.ssh_hosts.available()
            if reason is not None:
                skip = "--ssh-sizes --fleet-sizes --watch-jobs 0"
                sys.exit(f"{reason}: skip the sections on SSH hosts with {skip}")
            progress(f"making {hosts_needed(args)} namespace hosts ...")
            b = stack.enter_context(
                bench(hosts_needed(args), ansible=bool(args.fleet_sizes), prefix="dstack-scale-")
            )
            # every dstack run on the hosts' side, the watch's Project too: the benchmark's
            # local agent, never the user's
            b.env.update(local_env(b.env, work / "local-agent"))
        run_tasks(args, work, b, results)
        sides = [side for side, command in results if command == APPLY and side != "terraform"]
        for side in sides:
            print_tasks(results, side)
        if args.terraform_sizes:
            print_terraform(results, sides)
        for hosts in args.fleet_sizes:
            assert b is not None
            fleets[hosts] = scale_hosts.fleet_create(b, hosts, args.repeats)
        if args.watch_jobs > 0:
            assert b is not None
            watch = scale_hosts.watch_tick(
                b, args.watch_jobs, args.watch_agents, args.watch_ticks, args.watch_interval
            )
    targets = [t for side in sides for t in task_targets(results, side)]
    targets += fleet_targets(fleets) + watch_targets(watch)
    return report(targets)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # everything is gone already: the context managers cleaned up
        sys.exit("interrupted")
