"""The fleet-apply half of benchmarks/fanout.py: a fresh `dstack apply` of a 10-host SSH fleet
against `ansible all -m setup`, and the re-apply and plan of the unchanged fleet.

Each round runs, in turn:

- `dstack apply -y` of a project with one SSH fleet on hosts made fresh first (untimed): every
  agent stopped, its directory `<agent dir>/hosts/<node>/` removed, the state file deleted. So
  it measures pre-flight, agent upload, start and host facts on every host;
- `ansible all -m setup` on the same hosts (forks one a host, pipelining, interpreter given);
- `dstack apply -y` again (must be a no-op) and `dstack plan` of the unchanged fleet.

Targets: the fresh apply's median no slower than Ansible's, the re-apply's under 1 s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import fanout_hosts
from fanout_hosts import Bench, Check, ansible_env, lines_with, print_table, timed, write_project

from dstack_plan.agent.daemon import stop
from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.liveness import is_running

FRESH, ANSIBLE = "dstack apply (fresh)", "ansible -m setup"
REAPPLY, PLAN = "dstack re-apply", "dstack plan"
REAPPLY_TARGET = 1.0
FRESH_TARGET = "fresh apply <= 1x ansible -m setup"
REAPPLY_TARGET_NAME = f"re-apply < {REAPPLY_TARGET:g} s"
TIMING = Path(__file__).with_name("fanout_timing.py")
NO_CHANGES = "No changes."


class ApplyHalf:
    """The project, the inventory and the sides of the apply half on the first `hosts` hosts."""

    def __init__(self, b: Bench, hosts: int):
        self.b = b
        self.names = b.names[:hosts]
        addresses = b.addresses(hosts)
        self.project = write_project(b.work / "apply-project", b.key, addresses)
        self.state = self.project / ".dstack" / "state.json"
        self.ansible_env = ansible_env(b, b.work / "apply-ansible", addresses)

    def agent_data(self, name: str) -> DataDir:
        """The data dir of host `name`'s agent (`uname -n` is the host's name)."""
        return DataDir(self.b.agent_dir / "hosts" / name / "data")

    def make_fresh(self) -> None:
        """No agent on any host, none of its files, no state: what a first apply finds."""
        self.stop_agents()
        for name in self.names:
            shutil.rmtree(self.b.agent_dir / "hosts" / name, ignore_errors=True)
        for path in (self.state, self.state.with_name(f"{self.state.name}.backup")):
            path.unlink(missing_ok=True)

    def stop_agents(self) -> None:
        """Stop every host's agent (the hosts share this filesystem: its pid and lock files
        are here, and the agent's own `stop` reads them)."""
        for name in self.names:
            if self.agent_data(name).root.exists():
                stop(self.agent_data(name), timeout=5.0)

    def created(self, done: subprocess.CompletedProcess[str]) -> str | None:
        """A check: the fleet was created, every host `idle` with its facts, its agent up."""
        if "Resources: 1 added" not in done.stdout:
            return "the apply did not create the fleet"
        hosts = json.loads(self.state.read_text())["resources"]["fleet.bench"]["attributes"]
        ready = [h for h in hosts["hosts"] if h["status"] == "idle" and h["resources"]]
        if len(ready) != len(self.names):
            return f"{len(ready)} of {len(self.names)} hosts ready in state"
        down = [n for n in self.names if not is_running(self.agent_data(n))]
        return f"no agent runs on {', '.join(down)}" if down else None

    def sides(self) -> dict[str, tuple[list[str], dict[str, str], Check]]:
        """Side -> (argv, environment, check of what it printed)."""
        env, project = self.b.env, str(self.project)
        no_op = lines_with(NO_CHANGES, 1)
        return {
            FRESH: ([str(fanout_hosts.DSTACK), "apply", "-y", project], env, self.created),
            ANSIBLE: (
                [str(fanout_hosts.ANSIBLE), "all", "-m", "setup"],
                self.ansible_env,
                lines_with("SUCCESS", len(self.names)),
            ),
            REAPPLY: ([str(fanout_hosts.DSTACK), "apply", "-y", project], env, no_op),
            # exit 2 (changes present) fails the run, as any non-zero exit does
            PLAN: ([str(fanout_hosts.DSTACK), "plan", "--detailed-exitcode", project], env, no_op),
        }

    def run(self, rounds: int) -> dict[str, list[float]]:
        """One warm-up round (page cache, .pyc files), then `rounds` timed ones."""
        sides = self.sides()
        times: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(rounds + 1):
            for side, (argv, env, check) in sides.items():
                if side == FRESH:
                    self.make_fresh()
                elapsed = timed(argv, env, self.b.work, check)
                if round_:
                    times[side].append(elapsed)
        return times

    def explain(self, side: str) -> None:
        """Run `side` once more under benchmarks/fanout_timing.py and print its steps."""
        argv, env, _ = self.sides()[side]
        if side == FRESH:
            self.make_fresh()
        timing = [sys.executable, str(TIMING), *argv[1:]]
        done = subprocess.run(timing, env=env, cwd=self.b.work, capture_output=True, text=True)
        table = done.stderr.find("\nstep ")  # fanout_timing's table, after any log lines
        steps = done.stderr[table + 1 :] if table >= 0 else ""
        print(f"where the time of `dstack {argv[1]}` ({side}) goes:")
        print(steps.rstrip() or f"(no step table: exit {done.returncode})\n{done.stderr}")


def report(hosts: int, rounds: int, times: dict[str, list[float]]) -> dict[str, bool]:
    """Print the table and a line per target: target -> whether it was met."""
    medians = print_table(
        f"SSH fleet of {hosts} hosts, median of {rounds} alternating rounds", times, [ANSIBLE]
    )
    fresh, setup, reapply = medians[FRESH], medians[ANSIBLE], medians[REAPPLY]
    fresh_ok, reapply_ok = fresh <= setup, reapply < REAPPLY_TARGET
    print(
        f"fresh apply {fresh:.3f} s: {fresh / setup:.2f}x `ansible -m setup` "
        f"(target <= 1x) -> {'PASS' if fresh_ok else 'FAIL'}"
    )
    print(
        f"re-apply {reapply:.3f} s, plan {medians[PLAN]:.3f} s (target: re-apply < "
        f"{REAPPLY_TARGET:g} s) -> {'PASS' if reapply_ok else 'FAIL'}"
    )
    return {FRESH_TARGET: fresh_ok, REAPPLY_TARGET_NAME: reapply_ok}


def run_apply_half(b: Bench, hosts: int, rounds: int) -> dict[str, bool]:
    """The apply half on the first `hosts` of `b`'s hosts: target -> whether it was met. A
    missed target is followed by where the time of that command goes."""
    half = ApplyHalf(b, hosts)
    try:
        met = report(hosts, rounds, half.run(rounds))
        for side, target in ((FRESH, FRESH_TARGET), (REAPPLY, REAPPLY_TARGET_NAME)):
            if not met[target]:
                print()
                half.explain(side)
        return met
    finally:
        half.stop_agents()
