"""Job start latency: `POST /jobs` to the job's first log line, against running it directly.

    python benchmarks/job_start.py [-n 10]

Docker runtime vs `docker run --rm` (same image, command and options: host network, init),
and process runtime vs `sh -c` through subprocess. Both sides run in the same process run,
alternating. Headline: the docker ratio of medians; target < 1.3.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dstack_plan.agent.api_models import JobSpec  # noqa: E402
from dstack_plan.agent.client import AgentClient  # noqa: E402
from tests.infra.agent_process import AgentProcess, remove_agent_containers  # noqa: E402
from tests.infra.docker_images import ensure_busybox_image  # noqa: E402

TARGET = 1.3
COMMAND = "echo hello"


async def agent_first_line(client: AgentClient, job: JobSpec) -> float:
    """Seconds from submit to the first log bytes (streamed), then clean up untimed."""
    started = time.perf_counter()
    await client.submit(job)
    elapsed = None
    async for chunk in client.follow_logs(job.id):
        if elapsed is None and chunk.data:
            elapsed = time.perf_counter() - started
    assert elapsed is not None, f"job {job.id} printed nothing"
    await client.wait(job.id, timeout=30)
    await client.delete(job.id)
    return elapsed


def direct_first_line(argv: list[str]) -> float:
    """Seconds from spawning `argv` to its first stdout line; waits for it to exit (untimed)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - started
    proc.stdout.read()
    proc.wait()
    assert line, f"{argv} printed nothing"
    return elapsed


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return statistics.median(ordered), p90


async def run(n: int) -> None:
    image = ensure_busybox_image()
    docker_argv = ["docker", "run", "--rm", "--network", "host", "--init", image, "sh", "-c"]
    with tempfile.TemporaryDirectory(prefix="bench-job-start-") as tmp:
        agent = AgentProcess(Path(tmp) / "agent").start()
        try:
            async with agent.client(timeout=30) as client:
                timings: dict[str, list[float]] = {
                    "agent docker": [],
                    "docker run --rm": [],
                    "agent process": [],
                    "subprocess sh -c": [],
                }
                for i in range(n + 1):  # round 0 warms caches up and is not counted
                    samples = {
                        "agent docker": await agent_first_line(
                            client,
                            JobSpec(id=f"d{i}", run_name="bench", image=image, commands=[COMMAND]),
                        ),
                        "docker run --rm": direct_first_line([*docker_argv, COMMAND]),
                        "agent process": await agent_first_line(
                            client, JobSpec(id=f"p{i}", run_name="bench", commands=[COMMAND])
                        ),
                        "subprocess sh -c": direct_first_line(["sh", "-c", COMMAND]),
                    }
                    if i:
                        for name, value in samples.items():
                            timings[name].append(value)
        finally:
            agent.kill()
            remove_agent_containers([agent.agent_id])

    print(f"job start to first log line, n={n} each, alternating (ms)")
    print(f"{'':<20}{'median':>10}{'p90':>10}")
    for name, values in timings.items():
        median, p90 = summary(values)
        print(f"{name:<20}{median * 1e3:>10.1f}{p90 * 1e3:>10.1f}")
    docker_ratio = summary(timings["agent docker"])[0] / summary(timings["docker run --rm"])[0]
    process_ratio = summary(timings["agent process"])[0] / summary(timings["subprocess sh -c"])[0]
    overhead = summary(timings["agent process"])[0] - summary(timings["subprocess sh -c"])[0]
    print(f"process runtime: agent / subprocess = {process_ratio:.2f}x (+{overhead * 1e3:.1f} ms)")
    verdict = "meets" if docker_ratio < TARGET else "MISSES"
    print(
        f"docker job start: agent / docker run = {docker_ratio:.2f}x "
        f"(target < {TARGET}: {verdict})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10, help="samples per side")
    asyncio.run(run(parser.parse_args().n))


if __name__ == "__main__":
    main()
