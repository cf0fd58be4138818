"""How long `dstack plan` takes for large projects, end to end, in-process.

Generates N resources of mixed kinds (35% tasks, 25% services, 15% dev environments, 10%
fleets, 10% volumes, 5% gateways; 20 documents per file, runs referring to fleets, volumes and
gateways of their file) and a matching state built with the `dstack_plan.state` API from a first
plan, as apply would record it. Runs in state reference jobs on a real local agent started on a
temp data dir: a few are real jobs submitted to it (finished, and running), the others are ids
the agent does not know, recorded as finished (so they are not drift). This version has no
provider for declared fleets yet, so state records the runs on the built-in `local` fleet,
whose agent refresh can ask (the diff compares specs, not where runs were placed).

Measured: `Project.plan()` from a fresh `Project` (load, normalise, refresh against the agent,
placement, diff, graph), the median of several runs, for
  (a) a no-op plan against the matching state and
  (b) a plan with 10% changes (updates in place, replacements, new runs, removed runs).

Target: 10,000 resources planned in under 3 s on a 2-core machine, and linear growth: 10x the
resources take under 15x the time (per resource at most 1.5x: bigger dicts, sets and heaps miss
the CPU caches more; a quadratic step would show as ~100x).

    python benchmarks/plan_scale.py [--sizes 1000 10000] [--repeats N] [--profile N]

`--profile N` prints a cProfile of one plan of N resources (10% changes) instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dstack_plan.agent.api_models import JobSpec  # noqa: E402
from dstack_plan.apply.handlers import ResourceHandler  # noqa: E402
from dstack_plan.apply.unsupported import UnsupportedHandler  # noqa: E402
from dstack_plan.config.kinds import RUN_KINDS  # noqa: E402
from dstack_plan.plan.model import Action, Plan  # noqa: E402
from dstack_plan.plan.normalize import spec_from_normalized  # noqa: E402
from dstack_plan.project import Project  # noqa: E402
from dstack_plan.providers.local import LOCAL_FLEET  # noqa: E402
from dstack_plan.runs.jobs import job_id, slots  # noqa: E402
from dstack_plan.state.local import LocalBackend  # noqa: E402
from dstack_plan.state.model import ResourceState, State  # noqa: E402

TARGET_SECONDS = 3.0
TARGET_RATIO = 15.0
GROUP = 20
"""Documents per file; each file is one self-contained group of resources."""
REAL_DONE_JOBS = 8


class BenchProject(Project):
    """A project whose fleets, volumes and gateways plan as if their providers were there,
    with no machine behind them.

    This version cannot create cloud fleets, volumes or gateways, so a real plan refuses
    them; and a real refresh of an SSH fleet connects to its hosts. The benchmark measures
    what planning costs, so every provider counts as installed and fleets are refreshed from
    state alone (their hosts are `.invalid` names, which never resolve, besides)."""

    def unsupported(self, items: Any) -> dict[tuple[str, str], str]:
        return {}

    def handlers(self) -> dict[str, ResourceHandler]:
        return {**super().handlers(), "fleet": UnsupportedHandler()}


REAL_RUNNING_JOBS = 2

FLEET = """type: fleet
name: pool-{g}
nodes: 0..4
placement: cluster
backends: [aws]
spot_policy: auto
idle_duration: 1h
resources:
  gpu: H100:8
"""
SSH_FLEET = """type: fleet
name: onprem-{g}
ssh_config:
  user: ubuntu
  identity_file: {key}
  hosts:
    - h11.g{a}-{b}.invalid
    - h12.g{a}-{b}.invalid
    - hostname: h13.g{a}-{b}.invalid
      port: 2222
"""
VOLUME = """type: volume
name: data-{g}-{j}
backend: aws
region: us-east-1
size: {size}GB
"""
GATEWAY = """type: gateway
name: gw-{g}
backend: aws
region: us-east-1
domain: gw{g}.example.com
"""
TASK = """type: task
name: train-{g}-{j}
python: "3.12"
nodes: 2
fleets: [pool-{g}]
volumes:
  - name: data-{g}-0
    path: /data
env:
  - NCCL_DEBUG=INFO
  - HF_TOKEN
commands:
  - pip install -r requirements.txt
  - torchrun --nproc-per-node=$DSTACK_GPUS_PER_NODE --nnodes=$DSTACK_NODES_NUM train.py --seed {j}
resources:
  gpu: A100:80GB:8
  shm_size: 24GB
  disk: 500GB..
retry:
  on_events: [no-capacity, interruption]
  duration: 4h
max_duration: 1d
"""
SERVICE = """type: service
name: llm-{g}-{j}
image: vllm/vllm-openai:latest
fleets: [onprem-{g}]
gateway: gw-{g}
env:
  MODEL: Qwen/Qwen2.5-7B-Instruct
commands:
  - vllm serve $MODEL --port 8000
port: 8000
model: Qwen/Qwen2.5-7B-Instruct
replicas: {replicas}
scaling:
  metric: rps
  target: 10
resources:
  gpu: 24GB..:1
  memory: 32GB..
"""
DEV = """type: dev-environment
name: dev-{g}-{j}
python: "3.11"
ide: vscode
fleets: [pool-{g}]
volumes:
  - name: data-{g}-1
    path: /workspace/data
init:
  - pip install -r requirements.txt
inactivity_duration: {idle}
resources:
  gpu: 1
"""


def group_documents(g: int, changed: bool = False, key: Path = Path("id_bench")) -> list[str]:
    """The 20 documents of group `g`; `changed` edits 2 of them (10%).

    Even groups: a task's command changes (replace) and a service is scaled (update in place).
    Odd groups: a dev environment is renamed (one run removed, one created) and a fleet is
    resized (update in place).
    """
    a, b = divmod(g, 250)
    even = g % 2 == 0
    fleet = FLEET.format(g=g)
    if changed and not even:
        fleet = fleet.replace("nodes: 0..4", "nodes: 0..8")
    docs = [
        fleet,
        SSH_FLEET.format(g=g, a=a, b=b, key=key),
        VOLUME.format(g=g, j=0, size=500),
        VOLUME.format(g=g, j=1, size=100),
        GATEWAY.format(g=g),
    ]
    for j in range(7):
        text = TASK.format(g=g, j=j)
        if changed and even and j == 0:
            text = text.replace("--seed 0", "--seed 100")
        docs.append(text)
    for j in range(5):
        replicas = "2..8" if changed and even and j == 0 else "1..4"
        docs.append(SERVICE.format(g=g, j=j, replicas=replicas))
    for j in range(3):
        text = DEV.format(g=g, j=j, idle="2h")
        if changed and not even and j == 0:
            text = text.replace(f"name: dev-{g}-0", f"name: dev-{g}-new")
        docs.append(text)
    assert len(docs) == GROUP
    return docs


def write_project(root: Path, n: int, changed: bool = False) -> None:
    for old in root.glob("*.dstack.yml"):
        old.unlink()
    # plan checks that the key files SSH fleets name can be read: one that can, never used
    key = root / "id_bench"
    key.write_text("not a key: the benchmark's hosts are never reached\n")
    for g in range(n // GROUP):
        documents = group_documents(g, changed, key)
        (root / f"group-{g:05d}.dstack.yml").write_text("---\n".join(documents))


async def submit_real_jobs(project: Project, names: list[str], command: str) -> list[str]:
    agent = project.local.client()
    ids = []
    for name in names:
        info = await agent.submit(JobSpec(run_name=name, commands=[command]))
        ids.append(info.id)
    return ids


async def wait_finished(project: Project, ids: list[str]) -> None:
    agent = project.local.client()
    for job in ids:
        await agent.wait(job, timeout=60)


async def build_state(root: Path, state_path: Path, agent_dir: Path) -> list[str]:
    """Plan once against no state, record every create as apply would; return real job ids."""
    project = BenchProject(root, state_path=state_path, agent_dir=agent_dir)
    try:
        plan, _ = await project.plan()
        runs = [c for c in plan.changes if c.kind in RUN_KINDS]
        done_runs = [c.address for c in runs if c.kind == "task"][:REAL_DONE_JOBS]
        live_runs = [c.address for c in runs if c.kind == "service"][:REAL_RUNNING_JOBS]
        done_ids = await submit_real_jobs(project, done_runs, "true")
        live_ids = await submit_real_jobs(project, live_runs, "sleep 600")
        await wait_finished(project, done_ids)
        real = dict(zip(done_runs + live_runs, done_ids + live_ids, strict=True))
        now = datetime.now(timezone.utc)
        state = State.empty()
        resources = {}
        for change in plan.changes:
            assert change.action is Action.CREATE and change.after is not None
            status, attributes = _recorded(change.kind, change.name, change.after, real, project)
            if change.address in live_runs:
                status = "running"
                attributes["jobs"][0]["status"] = "running"
            entry = ResourceState.create(
                change.address,
                provider=change.provider,
                spec=change.after,
                status=status,
                now=now,
                attributes=attributes,
                depends_on=change.depends_on,
            )
            resources[entry.address] = entry
        # `State.with_resource` copies the mapping each time: fine for apply's one-by-one
        # commits, quadratic for 10,000 at once; build the mapping, then add the last one.
        last = resources.popitem()[1]
        state = state.model_copy(update={"resources": resources}).with_resource(last)
        LocalBackend(state_path, secret_guard=project.guard).write(state, "absent")
        return live_ids
    finally:
        await project.close()


def _recorded(
    kind: str, name: str, spec: dict[str, Any], real: dict[str, str], project: Project
) -> tuple[str, dict[str, Any]]:
    if kind not in RUN_KINDS:
        return "active", {"price_per_hour": 0.0 if kind != "fleet" else 12.5}
    typed = spec_from_normalized(kind, spec)
    generation = 1_700_000_000_000
    records = []
    for slot in slots(typed):  # type: ignore[arg-type]
        records.append(
            {
                "id": job_id(name, slot, generation, project.deployment.key),
                "host": "localhost",
                "replica": slot.replica,
                "node": slot.node,
                "status": "done" if kind == "task" else "terminated",
                "runtime": "docker",
            }
        )
    address = f"{kind}.{name}"
    if address in real:
        records[0] = {**records[0], "id": real[address], "status": "done", "runtime": "process"}
    status = "done" if kind == "task" else "terminated"
    attributes = {
        "fleet": LOCAL_FLEET,
        "generation": generation,
        "deployment": project.deployment.key,
        "price_per_hour": 0.0,
        "jobs": records,
    }
    return status, attributes


async def plan_once(root: Path, state_path: Path, agent_dir: Path) -> tuple[float, float, Plan]:
    """Wall and CPU seconds (this process; the agent answers in its own) of one fresh plan."""
    start, cpu = time.perf_counter(), time.process_time()
    project = BenchProject(root, state_path=state_path, agent_dir=agent_dir)
    try:
        plan, _ = await project.plan()
    finally:
        await project.close()
    return time.perf_counter() - start, time.process_time() - cpu, plan


def counts(plan: Plan) -> str:
    by_action: dict[str, int] = {}
    for change in plan.changes:
        by_action[change.action.value] = by_action.get(change.action.value, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(by_action.items()))


def stop_agent(agent_dir: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "dstack_plan.agent", "stop", "--data-dir", str(agent_dir)],
        capture_output=True,
        timeout=60,
    )


class Prepared(NamedTuple):
    """One size's project, with a state matching it and the real jobs still running."""

    n: int
    root: Path
    state_path: Path
    live: list[str]


async def prepare(n: int, tmp: Path, agent_dir: Path) -> Prepared:
    root = tmp / f"project-{n}"
    root.mkdir()
    state_path = root / ".dstack" / "state.json"
    write_project(root, n)
    return Prepared(n, root, state_path, await build_state(root, state_path, agent_dir))


async def delete_live_jobs(prepared: Prepared, agent_dir: Path) -> None:
    project = BenchProject(prepared.root, state_path=prepared.state_path, agent_dir=agent_dir)
    try:
        agent = project.local.client()
        for job in prepared.live:
            await agent.delete(job, force=True)
    finally:
        await project.close()


async def measure_all(
    sizes: list[int], repeats: int | None, tmp: Path, agent_dir: Path, rows: list[tuple]
) -> None:
    """Time fresh plans of every size, no-op and with 10% changes.

    The sizes take turns, round by round: this VM's speed drifts by 20-35% within minutes,
    and timing them one after the other turned that drift into a false growth ratio.
    """
    prepared = [await prepare(n, tmp, agent_dir) for n in sizes]
    runs = {p.n: repeats or (7 if p.n <= 1_000 else 5) for p in prepared}
    try:
        for label, changed in (("no-op", False), ("10% changes", True)):
            for p in prepared:
                write_project(p.root, p.n, changed)
            times: dict[int, list[float]] = {p.n: [] for p in prepared}
            cpus: dict[int, list[float]] = {p.n: [] for p in prepared}
            plans: dict[int, Plan] = {}
            for round_ in range(max(runs.values())):
                for p in prepared:
                    if round_ < runs[p.n]:
                        seconds, cpu, plans[p.n] = await plan_once(p.root, p.state_path, agent_dir)
                        times[p.n].append(seconds)
                        cpus[p.n].append(cpu)
            for p in prepared:
                if not changed:
                    assert not plans[p.n].has_changes, counts(plans[p.n])
                median, best = statistics.median(times[p.n]), min(times[p.n])
                row = (p.n, label, median, best, statistics.median(cpus[p.n]))
                rows.append((*row, counts(plans[p.n])))
    finally:
        for p in prepared:
            await delete_live_jobs(p, agent_dir)


async def profile(n: int, tmp: Path, agent_dir: Path) -> None:
    root = tmp / f"project-{n}"
    root.mkdir()
    state_path = root / ".dstack" / "state.json"
    write_project(root, n)
    await build_state(root, state_path, agent_dir)
    write_project(root, n, changed=True)
    profiler = cProfile.Profile()
    profiler.enable()
    seconds, _, plan = await plan_once(root, state_path, agent_dir)
    profiler.disable()
    print(f"{n} resources: {seconds:.3f} s ({counts(plan)})")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(50)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", type=int, metavar="N", help="cProfile one plan of N")
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 10_000])
    parser.add_argument("--repeats", type=int, help="plans per size (default 7 for 1k, 5 else)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        agent_dir = tmp / "agent"
        try:
            if args.profile:
                asyncio.run(profile(args.profile, tmp, agent_dir))
                return 0
            rows: list[tuple] = []
            # one event loop for everything: asyncio.run formats a repr of its main task's
            # result on the way out, which is slow for big plans (see cli.common.run_with)
            asyncio.run(measure_all(args.sizes, args.repeats, tmp, agent_dir, rows))
        finally:
            stop_agent(agent_dir)
    rows.sort(key=lambda row: row[0])  # by size; stable, so no-op stays first
    header = ("resources", "plan", "median s", "min s", "cpu s", "us/res")
    print("{:>9} {:<11} {:>8} {:>6} {:>6} {:>6}  actions".format(*header))
    for n, label, median, best, cpu, actions in rows:
        per = median / n * 1e6
        print(f"{n:>9} {label:<11} {median:>8.3f} {best:>6.3f} {cpu:>6.3f} {per:>6.0f}  {actions}")
    big = [r for r in rows if r[0] == max(args.sizes)]
    small = [r for r in rows if r[0] == min(args.sizes)]
    worst = max(r[2] for r in big)
    # growth from the fastest runs: the medians of small sizes are the noisiest
    ratio = max(b[3] / s[3] for b, s in zip(big, small, strict=True))
    ok = worst < TARGET_SECONDS and ratio < TARGET_RATIO
    print(
        f"plan {max(args.sizes):,} resources: {worst:.2f} s (target < {TARGET_SECONDS:g} s), "
        f"{max(args.sizes) // min(args.sizes)}x size -> {ratio:.1f}x time "
        f"(target < {TARGET_RATIO:g}) -> {'OK' if ok else 'MISS'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
