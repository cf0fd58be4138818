"""The task half of benchmarks/scale.py: `dstack apply -y`, no-op `dstack plan` and `dstack
destroy -y` of N trivial tasks as whole processes, on the local fleet and on an SSH fleet of
namespace hosts (benchmarks/fanout_hosts.py), and Terraform's apply of N `terraform_data`.

A trivial task is one process job, `sleep 3600`, asking `{cpu: 1.., memory: 0.1GB.., disk:
1GB..}`: CPUs, memory and disk are not divided among jobs (docs/scheduler.md), so any number
fits one host. On the SSH fleet each host carries a label `host: bK` and task i asks for host
i mod hosts: the scheduler would otherwise put every CPU-only task on the same host (best fit).

Every command is a fresh `dstack` process (the interpreter's start included): its wall time,
and the user + system CPU time of it and what it waited for (`RUSAGE_CHILDREN` deltas; the
agents, daemons of their own, are not counted). Between apply and plan the runs are waited for
until `dstack ps` says every one is running (untimed), so the no-op plan is of running runs.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fanout_hosts
from fanout_hosts import Bench, Check, lines_with

from dstack_plan.agent.daemon import stop
from dstack_plan.agent.datadir import AGENT_DIR_ENV, DataDir

APPLY, PLAN, DESTROY = "apply", "no-op plan", "destroy"
COMMANDS = (APPLY, PLAN, DESTROY)
TIMEOUT = 3600.0
"""Seconds any one command may take."""
READY_TIMEOUT = 600.0
"""Seconds to wait, after an apply, for every run to be reported running."""
TASK = (
    "type: task\nname: t{i}\ncommands: ['sleep 3600']\n"
    "resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB..}}\n"
)
SSH_TASK = TASK + "fleets: [bench]\nlabels: {{host: {host}}}\n"
TERRAFORM_RESOURCE = 'resource "terraform_data" "t{i}" {{\n  input = "sleep 3600"\n}}\n'


@dataclass(frozen=True)
class Measured:
    wall: float
    cpu: float
    """User + system CPU seconds of the process (and of its children it waited for)."""
    kernel: float = 0.0
    """CPU seconds the kernel's own threads used meanwhile (`kernel_threads_cpu`)."""


Results = dict[tuple[str, str], dict[int, list[Measured]]]
"""(side, command) -> tasks -> one measurement per run."""


def median(values: Sequence[Measured]) -> Measured:
    return Measured(
        statistics.median(m.wall for m in values),
        statistics.median(m.cpu for m in values),
        statistics.median(m.kernel for m in values),
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def kernel_threads_cpu() -> dict[str, int]:
    """CPU ticks each of the kernel's own threads (kthreadd's children: kworkers, kdamond,
    ...) has used since it started, by pid; empty where /proc does not tell. Work the machine
    does beside the benchmark's processes that may grow with them: on the VM of
    docs/scale.md a memory monitor (kdamond) takes 9% of a core while 1,000 process jobs run
    and 80% while 10,000 do, which a 2-core machine's wall times show."""
    try:
        pids = Path("/proc/2/task/2/children").read_text().split()
    except OSError:
        return {}
    ticks = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        ticks[pid] = int(fields[11]) + int(fields[12])  # utime, stime (stat's 14th and 15th)
    return ticks


def kernel_cpu_since(before: dict[str, int]) -> float:
    """CPU seconds the kernel's threads used since `before` (`kernel_threads_cpu`): those
    alive now, a thread started meanwhile counted whole (kworkers come and go; one that
    ended meanwhile is not seen, so this may tell a little less, never less than 0)."""
    now = kernel_threads_cpu()
    ticks = sum(max(0, used - before.get(pid, 0)) for pid, used in now.items())
    return ticks / os.sysconf("SC_CLK_TCK")


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run(argv: Sequence[str], env: dict[str, str], cwd: Path, check: Check) -> Measured:
    """Wall and CPU seconds of one run; exits when it fails or `check` finds what it printed
    wrong (showing the end of its output: a plan of 10,000 runs is 10,000 lines)."""
    cpu, kernel, started = _children_cpu(), kernel_threads_cpu(), time.perf_counter()
    done = subprocess.run(
        list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT
    )
    measured = Measured(
        time.perf_counter() - started, _children_cpu() - cpu, kernel_cpu_since(kernel)
    )
    problem = f"exit {done.returncode}" if done.returncode != 0 else check(done)
    if problem is not None:
        output = f"{_tail(done.stdout)}\n{_tail(done.stderr)}"
        sys.exit(f"{' '.join(argv[:3])} ...: {problem}\n{output}")
    return measured


def progress(text: str) -> None:
    """A line on stderr, so that a long run shows where it is; stdout keeps the tables."""
    print(text, file=sys.stderr, flush=True)


def wait_running(env: dict[str, str], project: Path, n: int) -> list[dict[str, Any]]:
    """Until `dstack ps` reports `n` runs running (exits after READY_TIMEOUT); its runs."""
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        done = subprocess.run(
            [str(fanout_hosts.DSTACK), "ps", "--json", str(project)],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        runs = json.loads(done.stdout) if done.returncode == 0 else []
        running = sum(1 for r in runs if r["status"] == "running")
        if running == n:
            return list(runs)
        if time.monotonic() > deadline:
            sys.exit(f"{project}: {running} of {n} runs running\n{_tail(done.stderr)}")
        time.sleep(1.0)


class TaskSide:
    """Where tasks go: a project dir per size on the built-in `local` fleet."""

    label = "local"

    def __init__(self, work: Path, env: dict[str, str]):
        self.work = work
        self.env = env

    def project(self, n: int) -> Path:
        """A fresh project of `n` tasks."""
        directory = self.work / f"{self.label}-{n}"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        (directory / "tasks.dstack.yml").write_text(
            "---\n".join(TASK.format(i=i) for i in range(n))
        )
        return directory

    def destroy_argv(self, project: Path, n: int) -> list[str]:
        return [str(fanout_hosts.DSTACK), "destroy", "-y", str(project)]

    def check_placement(self, runs: list[dict[str, Any]]) -> None:
        """Exits when the runs are not where they should be (the local fleet: anywhere)."""

    def done_with(self, project: Path) -> None:
        shutil.rmtree(project, ignore_errors=True)

    def cycle(self, n: int, plans: int, results: Results) -> None:
        """Apply `n` tasks, wait until they run, `plans` no-op plans, destroy them."""
        project = self.project(n)
        measured: dict[str, list[Measured]] = {command: [] for command in COMMANDS}

        def timed(command: str, argv: list[str], check: Check) -> None:
            measured[command].append(run(argv, self.env, self.work, check))

        dstack = str(fanout_hosts.DSTACK)
        progress(f"{self.label}: apply of {n:,} tasks ...")
        timed(APPLY, [dstack, "apply", "-y", str(project)], lines_with(f"Resources: {n} added", 1))
        self.check_placement(wait_running(self.env, project, n))
        for _ in range(plans):  # exit 2 (changes present) fails, as any non-zero exit does
            argv = [dstack, "plan", "--detailed-exitcode", str(project)]
            timed(PLAN, argv, lines_with("No changes.", 1))
        progress(f"{self.label}: destroy of {n:,} tasks ...")
        destroyed = lines_with(f"Resources: {n} destroyed", 1)
        timed(DESTROY, self.destroy_argv(project, n), destroyed)
        self.done_with(project)
        for command, values in measured.items():
            results.setdefault((self.label, command), {}).setdefault(n, []).extend(values)
        walls = ", ".join(f"{c} {median(v).wall:.2f} s" for c, v in measured.items())
        progress(f"{self.label}: {n:,} tasks: {walls}")


class SSHTaskSide(TaskSide):
    """One project holding an SSH fleet `bench` of the first `hosts` hosts, each labelled
    `host: bK`, created (untimed) before any size: the tasks land on warm hosts. Each size
    writes its tasks beside the fleet and destroys them alone (`--target` every task: the
    fleet stays); `close()` destroys the fleet."""

    def __init__(self, b: Bench, hosts: int, env: dict[str, str]):
        super().__init__(b.work, env)
        self.label = f"ssh ({hosts} hosts)"
        self.names = b.names[:hosts]
        self.directory = b.work / "ssh-project"
        self.directory.mkdir()
        entries = "".join(
            f"    - hostname: {address}\n      labels: {{host: {name}}}\n"
            for name, address in zip(self.names, b.addresses(hosts), strict=True)
        )
        (self.directory / "fleet.dstack.yml").write_text(
            f"type: fleet\nname: bench\nssh_config:\n  user: root\n"
            f"  identity_file: {b.key}\n  hosts:\n{entries}"
        )
        progress(f"{self.label}: creating the fleet ...")
        argv = [str(fanout_hosts.DSTACK), "apply", "-y", str(self.directory)]
        run(argv, env, self.work, lines_with("Resources: 1 added", 1))

    def project(self, n: int) -> Path:
        (self.directory / "tasks.dstack.yml").write_text(
            "---\n".join(
                SSH_TASK.format(i=i, host=self.names[i % len(self.names)]) for i in range(n)
            )
        )
        return self.directory

    def destroy_argv(self, project: Path, n: int) -> list[str]:
        targets = [arg for i in range(n) for arg in ("--target", f"task.t{i}")]
        return [*super().destroy_argv(project, n), *targets]

    def check_placement(self, runs: list[dict[str, Any]]) -> None:
        """Every host runs its share: n // hosts tasks, or one more."""
        per_host = Counter(host for run in runs for host in run["hosts"])
        share = len(runs) // len(self.names)
        if len(per_host) < min(len(runs), len(self.names)) or min(per_host.values()) < share:
            sys.exit(f"{self.label}: the tasks are not spread over the hosts: {per_host}")

    def done_with(self, project: Path) -> None:
        (project / "tasks.dstack.yml").unlink()

    def close(self) -> None:
        """Destroy the fleet: its hosts are free for the next section."""
        argv = [str(fanout_hosts.DSTACK), "destroy", "-y", str(self.directory)]
        run(argv, self.env, self.work, lines_with("Resources: 1 destroyed", 1))


def terraform_apply(work: Path, n: int, env: dict[str, str], results: Results) -> None:
    """`terraform apply` of `n` `terraform_data` resources in a fresh directory (`terraform
    init` untimed; `terraform_data` is built in: no provider to fetch)."""
    directory = work / f"terraform-{n}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    (directory / "main.tf").write_text("".join(TERRAFORM_RESOURCE.format(i=i) for i in range(n)))
    tf_env = {**env, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
    terraform = shutil.which("terraform") or "terraform"
    run([terraform, "init", "-input=false", "-no-color"], tf_env, directory, lambda _: None)
    progress(f"terraform: apply of {n:,} terraform_data ...")
    argv = [terraform, "apply", "-auto-approve", "-input=false", "-no-color"]
    measured = run(argv, tf_env, directory, lines_with(f"Resources: {n} added", 1))
    results.setdefault(("terraform", APPLY), {}).setdefault(n, []).append(measured)
    progress(f"terraform: {n:,} terraform_data: apply {measured.wall:.2f} s")
    shutil.rmtree(directory, ignore_errors=True)


def local_env(base: dict[str, str], agent_dir: Path) -> dict[str, str]:
    """`base` with the local agent's data dir in `agent_dir`: not the user's agent. Python
    caches bytecode beside it, as an installed package has its `.pyc` files (the warm-up
    fills it; this sandbox's `PYTHONDONTWRITEBYTECODE` would make every command compile
    dstack_plan anew: benchmarks/cli_startup.py measures that case)."""
    env = {**base, AGENT_DIR_ENV: str(agent_dir), "NO_COLOR": "1", "LC_ALL": "C.UTF-8"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(agent_dir.parent / "pycache")
    return env


def stop_local_agent(agent_dir: Path) -> None:
    """Stop the agent of `agent_dir` (its pid file's process: the agent the benchmark's first
    apply started there), which ends its process jobs too."""
    if agent_dir.exists():
        stop(DataDir(agent_dir), timeout=60.0)


def sizes_run(results: Results, side: str) -> list[int]:
    return sorted(results.get((side, APPLY), {}))


def default_env(work: Path) -> dict[str, str]:
    """This process's environment with a home of its own in `work` (no user's settings)."""
    home = work / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    env.pop("SSH_AUTH_SOCK", None)
    return env
