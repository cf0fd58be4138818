"""How long SSH hosts take where the tests no longer time them: agents installed vs reused,
and `dstack watch` ticks while a host is down.

Needs root: the hosts are network namespaces running sshd (benchmarks/fanout_hosts.py, on a
network of their own). With the product's own settings (5 s keepalive, 10 s connect timeout):
- `install` vs `reuse`: `SSHProvider.create_instances` on 3 hosts with no agent there (the
  bundle uploaded, the agents started), then by a new provider, as a later command (the same
  build runs: nothing uploaded or started), alternating, --rounds times; medians and the
  ratio. Target: reuse/install < 1 (tests/integration/test_ssh_agent.py asserts that nothing
  is uploaded or started).
- watch ticks with a host down: a task runs on one host of a two-host fleet; watch ticks in
  this process (its clock advanced 5 s between ticks, as tests/e2e/test_watch_reachability.py
  does). `refused` (its sshd stopped, its connections dropped): each of three ticks, target
  < 15 s (told at once). `link down` (packets lost, nothing refused): the first tick (the
  keepalive finds the kept connection dead, then a connect timeout), target < 45 s; the next
  two (the host not dialled again on every request), target < 15 s each.

    python benchmarks/ssh_host_faults.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fanout_hosts import Bench, bench  # noqa: E402

from dstack_plan.clock import FakeClock  # noqa: E402
from dstack_plan.project import Project  # noqa: E402
from dstack_plan.providers.base import MachineResources, Offer  # noqa: E402
from dstack_plan.providers.ssh.hostkeys import MemoryHostKeyStore  # noqa: E402
from dstack_plan.providers.ssh.install import AgentBundle, build_bundle  # noqa: E402
from dstack_plan.providers.ssh.models import SSHTarget  # noqa: E402
from dstack_plan.providers.ssh.provider import SSHProvider  # noqa: E402
from dstack_plan.watch.loop import Watcher  # noqa: E402

REUSE_RATIO_TARGET = 1.0
REFUSED_TARGET = 15.0
LINK_DOWN_FIRST_TARGET = 45.0
LINK_DOWN_NEXT_TARGET = 15.0
OFFER = Offer(
    provider="ssh",
    instance_type="ssh",
    region="on-prem",
    resources=MachineResources(cpus=1, memory_gb=1, disk_gb=1),
    price_per_hour=0.0,
)
CLI = [sys.executable, "-m", "dstack_plan.cli"]


# -- install vs reuse -------------------------------------------------------------------------


def _provider(
    b: Bench, bundle: AgentBundle, store: MemoryHostKeyStore, remote: Path
) -> SSHProvider:
    targets = [SSHTarget(a, "root", identity_file=str(b.key)) for a in b.addresses(3)]
    return SSHProvider(
        {"bench": targets},
        host_keys=store,
        known_hosts=b.work / "known_hosts",
        bundle=bundle,
        agent_dir=str(remote),
    )


async def _timed(work: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await work()
    return time.perf_counter() - started


async def install_and_reuse(b: Bench, bundle: AgentBundle, round_: int) -> tuple[float, float]:
    remote = b.work / f"remote-{round_}"  # nothing there: a first install
    store = MemoryHostKeyStore()
    first = _provider(b, bundle, store, remote)
    try:
        install = await _timed(lambda: first.create_instances("bench", OFFER, 3))
        assert all(r.uploaded for r in first.installed.values()), first.problems
    finally:
        await first.close()
    second = _provider(b, bundle, store, remote)
    try:
        instances: list = []

        async def reuse() -> None:
            instances.extend(await second.create_instances("bench", OFFER, 3))

        reused = await _timed(reuse)
        assert not any(r.uploaded for r in second.installed.values()), second.problems
        await second.terminate(instances)
    finally:
        await second.close()
    shutil.rmtree(remote, ignore_errors=True)
    return install, reused


# -- watch ticks with a host down -------------------------------------------------------------


def _dstack(b: Bench, project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*CLI, *args], cwd=project, env=b.env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        sys.exit(f"dstack {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done


def _running_task(b: Bench, name: str) -> tuple[Path, str]:
    """A project with a two-host fleet and a task running on one of them; (it, that host)."""
    project = b.work / name
    project.mkdir()
    hosts = "".join(f"    - {a}\n" for a in b.addresses(2))
    (project / "fleet.dstack.yml").write_text(
        f"type: fleet\nname: onprem\nssh_config:\n  user: root\n"
        f"  identity_file: {b.key}\n  hosts:\n{hosts}"
    )
    (project / "long.dstack.yml").write_text(
        'type: task\nname: long\nfleets: [onprem]\ncommands: ["sleep 600"]\nstop_duration: 1s\n'
    )
    _dstack(b, project, "apply", "-y")
    deadline = time.monotonic() + 120
    while True:
        rows = json.loads(_dstack(b, project, "ps", "--json", "-a").stdout)
        row = next((r for r in rows if r["address"] == "task.long"), None)
        if row is not None and row["status"] == "running":
            break
        if time.monotonic() > deadline:
            sys.exit(f"task.long never ran: {row}")
        time.sleep(0.2)
    state = json.loads((project / ".dstack" / "state.json").read_text())
    return project, state["resources"]["task.long"]["attributes"]["jobs"][0]["host"]


async def _down_ticks(
    b: Bench, project: Path, host: str, down: Callable[[str], None], up: Callable[[str], None]
) -> list[float]:
    """Seconds of three watch ticks while `host` is down (`down`, then `up` again)."""
    name = next(n for n in b.names if b.network[n].address == host)
    watched = Project(project, agent_dir=b.work / "local-agent", clock=FakeClock(time.time()))
    watcher = Watcher(watched)
    try:
        await watcher.tick()  # the connections are kept from here on
        down(name)
        try:
            seconds = []
            for _ in range(3):
                seconds.append(await _timed(watcher.tick))
                watched.clock.advance(5)  # type: ignore[attr-defined]
        finally:
            up(name)
    finally:
        await watched.close()
    return seconds


def watch_ticks(b: Bench) -> dict[str, list[float]]:
    os.environ.update({k: b.env[k] for k in ("HOME", "DSTACK_PLAN_SSH_AGENT_DIR")})
    found = {}
    for scenario, down, up in (
        ("refused", b.network.cut_off, b.network.start),
        (
            "link down",
            lambda n: b.network.link(n, up=False),
            lambda n: b.network.link(n, up=True),
        ),
    ):
        project, host = _running_task(b, scenario.replace(" ", "-"))
        found[scenario] = asyncio.run(_down_ticks(b, project, host, down, up))
        _dstack(b, project, "destroy", "-y")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # a host down is warned about at every tick
    with bench(3, ansible=False, prefix="dstack-ssh-faults-") as b:
        b.env["DSTACK_PLAN_AGENT_DIR"] = str(b.work / "local-agent")
        bundle = build_bundle(b.work / "agent.pyz")
        sides: dict[str, list[float]] = {"install": [], "reuse": []}
        for round_ in range(args.rounds):
            install, reuse = asyncio.run(install_and_reuse(b, bundle, round_))
            sides["install"].append(install)
            sides["reuse"].append(reuse)
        ticks = watch_ticks(b)
    medians = {side: statistics.median(values) for side, values in sides.items()}
    ratio = medians["reuse"] / medians["install"]
    print(f"{'3 hosts':<12} {'median s':>9} {'min s':>7} {'max s':>7}")
    for side, values in sides.items():
        print(f"{side:<12} {medians[side]:>9.3f} {min(values):>7.3f} {max(values):>7.3f}")
    print(f"reuse/install: {ratio:.2f} (target < {REUSE_RATIO_TARGET:g})")
    print(f"{'host down':<12} {'tick 1 s':>9} {'tick 2 s':>9} {'tick 3 s':>9}")
    for scenario, seconds in ticks.items():
        print(f"{scenario:<12}" + "".join(f" {s:>9.2f}" for s in seconds))
    ok = (
        ratio < REUSE_RATIO_TARGET
        and max(ticks["refused"]) < REFUSED_TARGET
        and ticks["link down"][0] < LINK_DOWN_FIRST_TARGET
        and max(ticks["link down"][1:]) < LINK_DOWN_NEXT_TARGET
    )
    print(
        f"reuse {ratio:.2f}x install (target < {REUSE_RATIO_TARGET:g}); ticks with a host "
        f"refused <= {max(ticks['refused']):.1f} s (target < {REFUSED_TARGET:g}), link down "
        f"{ticks['link down'][0]:.1f} s then <= {max(ticks['link down'][1:]):.1f} s (targets < "
        f"{LINK_DOWN_FIRST_TARGET:g}, < {LINK_DOWN_NEXT_TARGET:g}) -> {'OK' if ok else 'MISS'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
