"""The web UI at scale: time to first byte and full load of the runs page and the hosts page
with 1,000 runs and 50 hosts in state, and the memory of a watch's metrics history after
hours of ticks.

    python benchmarks/web.py [--hosts 50] [--runs 1000] [--samples 20] [--hours 6]

Pages (needs root): 50 namespace hosts of one SSH fleet, each running the real agent
(benchmarks/fanout_hosts.py), and one `dstack apply -y` of 1,000 single-node tasks, 20 per
host (each host labelled `slot: N` and each task asking for its host's label, so that they
spread), each `sleep 3600` as a process job. Then `dstack ui` serves the project, and each
page is fetched `--samples` times after one warm-up: time to the first byte of the answer
and to its last (the pages are rendered whole on the server, and each asks the agents, as
`dstack ps` and `dstack top` do). Target: the median under 300 ms.

History: a `History` ring on a `FakeClock` fed one tick report every 5 s with 50 hosts of 8
GPUs each, for `--hours` hours; the traced memory it holds after each hour (tracemalloc) must
stop growing once the ring is full (6 hours), the watch's bound.

Everything (agents, jobs, namespaces, files) is removed at the end, also on Ctrl-C. Exit 0
when every target was met.
"""

from __future__ import annotations

import argparse
import gc
import re
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import fanout_hosts
import httpx
from fanout_hosts import Bench, bench
from watch_scale import apply

from dstack_plan.clock import FakeClock
from dstack_plan.watch.model import HostSeen, TickReport
from dstack_plan.web.history import History

PAGE_TARGET_MS = 300.0
TICK_SECONDS = 5.0
PAGES = {"runs page (/)": "/", "hosts page (/fleets)": "/fleets"}


def write_project(b: Bench, directory: Path, hosts: int, runs: int) -> None:
    """The fleet of `hosts` labelled hosts and `runs` tasks spread over them."""
    directory.mkdir(parents=True)
    entries = "".join(
        f"    - hostname: {address}\n      labels: {{slot: 's{i}'}}\n"
        for i, address in enumerate(b.addresses(hosts))
    )
    (directory / "fleet.dstack.yml").write_text(
        f"type: fleet\nname: bench\nssh_config:\n  user: root\n  identity_file: {b.key}\n"
        f"  hosts:\n{entries}"
    )
    docs = [
        f"type: task\nname: sleep-{i}\nfleets: [bench]\ncommands: ['sleep 3600']\n"
        f"stop_duration: 1s\nlabels: {{slot: 's{i % hosts}'}}\n"
        "resources: {cpu: 0.., memory: 0MB.., disk: 0GB..}\n"
        for i in range(runs)
    ]
    (directory / "runs.dstack.yml").write_text("---\n".join(docs))


def serve(b: Bench, directory: Path) -> tuple[subprocess.Popen[str], str]:
    ui = subprocess.Popen(
        [str(fanout_hosts.DSTACK), "ui", "--bind", "127.0.0.1:0", str(directory)],
        env=b.env,
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert ui.stdout is not None
    line = ui.stdout.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if not found:
        ui.kill()
        sys.exit(f"dstack ui did not start: {line}{ui.stderr.read() if ui.stderr else ''}")
    return ui, found.group(1)


def fetch(client: httpx.Client, url: str) -> tuple[float, float, int]:
    """(ms to the first byte, ms to the last, bytes) of one GET."""
    started = time.perf_counter()
    with client.stream("GET", url) as response:
        response.raise_for_status()
        chunks = response.iter_raw()
        first = next(chunks, b"")
        first_ms = (time.perf_counter() - started) * 1000
        size = len(first) + sum(len(c) for c in chunks)
    return first_ms, (time.perf_counter() - started) * 1000, size


def measure_pages(base: str, samples: int) -> dict[str, tuple[float, float, int]]:
    results = {}
    with httpx.Client(timeout=120) as client:
        for name, path in PAGES.items():
            fetch(client, base + path)  # warm-up: connections to the agents, templates
            runs = [fetch(client, base + path) for _ in range(samples)]
            results[name] = (
                statistics.median(r[0] for r in runs),
                statistics.median(r[1] for r in runs),
                runs[-1][2],
            )
    return results


def history_memory(hours: int, hosts: int = 50, gpus: int = 8) -> list[float]:
    """MB traced in the ring after each hour of ticks."""
    clock = FakeClock(1_800_000_000.0)
    history = History(clock)
    metrics = "".join(
        f'dstack_agent_gpu_utilization_percent{{gpu="{g}"}} 55.0\n'
        f'dstack_agent_gpu_memory_used_bytes{{gpu="{g}"}} {40 * 2**30}\n'
        for g in range(gpus)
    )
    text = (
        "# TYPE dstack_agent_gpu_utilization_percent gauge\n"
        "# TYPE dstack_agent_gpu_memory_used_bytes gauge\n" + metrics
    )
    host_list = tuple(
        HostSeen(
            fleet="bench", host=f"10.0.{i // 250}.{i % 250}", reachable=True, metrics_text=text
        )
        for i in range(hosts)
    )
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    per_hour = []
    ticks = int(3600 / TICK_SECONDS)
    for _ in range(hours):
        for _ in range(ticks):
            history.observe(
                TickReport(
                    started_at=clock.now(),
                    duration_s=0.2,
                    leader=True,
                    runs={f"task.sleep-{i}": "running" for i in range(20)},
                    hosts=host_list,
                    queue_depth=3,
                )
            )
            clock.advance(TICK_SECONDS)
        gc.collect()
        per_hour.append((tracemalloc.get_traced_memory()[0] - base) / 2**20)
    tracemalloc.stop()
    return per_hour


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--hours", type=int, default=8)
    args = parser.parse_args()

    print(f"history: {args.hours} hours of ticks every {TICK_SECONDS:g} s ...", flush=True)
    memory = history_memory(args.hours)
    with bench(args.hosts, ansible=False, prefix="dstack-web-") as b:
        project = b.work / "project"
        write_project(b, project, args.hosts, args.runs)
        print(f"applying {args.runs} runs on {args.hosts} hosts ...", flush=True)
        applied = apply(b, project)
        print(f"applied in {applied:.0f} s; fetching the pages ...", flush=True)
        ui, base = serve(b, project)
        try:
            pages = measure_pages(base, args.samples)
        finally:
            ui.terminate()
            ui.wait(10)

    print()
    print(f"| page ({args.runs} runs, {args.hosts} hosts) | first byte ms | full load ms | KB |")
    print("|---|---:|---:|---:|")
    for name, (first, full, size) in pages.items():
        print(f"| {name} | {first:.0f} | {full:.0f} | {size / 1024:.0f} |")
    print()
    print("| hours of history | " + " | ".join(str(h + 1) for h in range(len(memory))) + " |")
    print("|---|" + "---:|" * len(memory))
    print("| ring MB (traced) | " + " | ".join(f"{m:.1f}" for m in memory) + " |")
    pages_met = all(full < PAGE_TARGET_MS for _, full, _ in pages.values())
    full_at = min(len(memory), 6)  # the ring holds six hours
    bounded = not memory or all(m <= memory[full_at - 1] * 1.05 for m in memory[full_at - 1 :])
    print()
    print(
        f"web: pages {'met' if pages_met else 'MISSED'} (target < {PAGE_TARGET_MS:g} ms full "
        f"load), history {'bounded' if bounded else 'NOT bounded'} after {full_at} hours"
    )
    return 0 if pages_met and bounded else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("interrupted")
