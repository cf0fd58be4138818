"""Cost of masking secret values in job logs: a job printing ~50 MB with and without secrets.

    python benchmarks/log_masking.py [-n 5] [--mb 50] [--docker]

End to end: the same job on a real agent (process runtime; with `--docker` also in a
container), its three env values once given as secrets (masked: 100 of its lines print one)
and once as plain env (written through), from submit to done. Both sides run in the same
process run, alternating, and report the median and the ratio. In process: `MaskedLog.append`
with three values against a plain `LogStore.append`, 64 KiB chunks (what the process runtime
reads), to show the masking's own cost apart from the job's. Headline: the end-to-end ratio
of medians for the process runtime; target <= 1.10.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import SecretStr  # noqa: E402

from dstack_plan.agent.api_models import JobSpec  # noqa: E402
from dstack_plan.agent.client import AgentClient  # noqa: E402
from dstack_plan.agent.logstore import MASK, LogStore, MaskedLog  # noqa: E402
from tests.infra.agent_process import AgentProcess, remove_agent_containers  # noqa: E402

TARGET = 1.10
VALUES = {
    "HF_TOKEN": "hf_Zq81kXbT0pWm4c9LrVa2sYdE6uNiJ7oQ",
    "WANDB_API_KEY": "5c1f0e9b7a2d4c6e8f0a1b3c5d7e9f1a2b4c6d8e",
    "DB_PASSWORD": "correct-horse-battery",
}
LINE = "step {i} loss=0.123456 lr=0.0003 tokens/s=12345.6 grad_norm=1.2345"
SECRET_LINES = 100
"""About how many lines of the output print a secret value."""


def job_lines(megabytes: int) -> tuple[int, int]:
    """How many lines make about `megabytes` MB, and every how many lines a value comes."""
    lines = megabytes * 1_000_000 // (len(LINE) + 5)
    return lines, lines // SECRET_LINES


def job_command(megabytes: int) -> str:
    """awk printing about `megabytes` MB of training-log lines, about SECRET_LINES of them
    holding a value."""
    lines, every = job_lines(megabytes)
    return (
        f'awk -v t="$HF_TOKEN" \'BEGIN {{ for (i = 0; i < {lines}; i++) '
        f'if (i % {every} == 0) print "auth " t; '
        f'else print "step " i " loss=0.123456 lr=0.0003 tokens/s=12345.6 grad_norm=1.2345" }}\''
    )


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_job(client: AgentClient, job: JobSpec, agent_pid: int) -> tuple[float, float]:
    """Seconds from submit to done, and the agent's CPU seconds meanwhile (not the job's)."""
    cpu = cpu_seconds(agent_pid)
    started = time.perf_counter()
    await client.submit(job)
    info = await client.wait(job.id, timeout=600)
    elapsed = time.perf_counter() - started
    assert info.status.value == "done", info
    return elapsed, cpu_seconds(agent_pid) - cpu


def check_stored(agent: AgentProcess, job_id: str, masked: bool, count: int) -> int:
    """The stored log's size; a masked one holds `count` markers and no value."""
    data = b"".join(
        p.read_bytes() for p in sorted(agent.data_dir.glob(f"jobs/{job_id}/logs/*.log"))
    )
    token = VALUES["HF_TOKEN"].encode()
    if masked:
        assert token not in data and data.count(MASK) == count, job_id
    else:
        assert data.count(token) == count, job_id
    return len(data)


async def end_to_end(n: int, megabytes: int, docker: bool) -> dict[str, list[float]]:
    command = job_command(megabytes)
    lines, every = job_lines(megabytes)
    count = len(range(0, lines, every))
    image = None
    if docker:
        from tests.infra.docker_images import ensure_busybox_image  # noqa: PLC0415

        image = ensure_busybox_image()
    timings: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-log-masking-") as tmp:
        agent = AgentProcess(Path(tmp) / "agent").start()
        try:
            async with agent.client(timeout=60) as client:
                runtimes = [("process", None)] + ([("docker", image)] if docker else [])
                for i in range(n + 1):  # round 0 warms caches up and is not counted
                    for runtime, img in runtimes:
                        for masked in (False, True) if i % 2 else (True, False):
                            env: dict[str, str | SecretStr] = {
                                k: SecretStr(v) if masked else v for k, v in VALUES.items()
                            }
                            job_id = f"{runtime[0]}{'m' if masked else 'p'}{i}"
                            job = JobSpec(
                                id=job_id, run_name="bench", image=img, commands=[command], env=env
                            )
                            assert agent.proc is not None
                            elapsed, cpu = await run_job(client, job, agent.proc.pid)
                            size = check_stored(agent, job_id, masked, count)
                            await client.delete(job_id)
                            if i:
                                side = f"{runtime} {'secrets' if masked else 'plain'}"
                                timings.setdefault(side, []).append(elapsed)
                                timings.setdefault(f"_cpu {side}", []).append(cpu)
                                timings.setdefault("_bytes", []).append(size)
        finally:
            agent.kill()
            remove_agent_containers([agent.agent_id])
    return timings


def in_process(megabytes: int, rounds: int) -> tuple[float, float]:
    """Median seconds to store `megabytes` MB in 64 KiB chunks: plain, then masked."""
    lines, every = job_lines(megabytes)
    text = "".join(
        ("auth " + VALUES["HF_TOKEN"] if i % every == 0 else LINE.format(i=i)) + "\n"
        for i in range(lines)
    ).encode()
    chunks = [text[i : i + 65536] for i in range(0, len(text), 65536)]
    plain: list[float] = []
    masked: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-log-masking-") as tmp:
        for r in range(rounds + 1):
            for with_values in (False, True) if r % 2 else (True, False):
                store = LogStore(Path(tmp) / f"{r}-{with_values}", 2 * len(text))
                log = MaskedLog(store, VALUES.values() if with_values else ())
                started = time.perf_counter()
                for chunk in chunks:
                    log.append(chunk)
                log.flush()
                elapsed = time.perf_counter() - started
                store.close()
                if r:
                    (masked if with_values else plain).append(elapsed)
    return statistics.median(plain), statistics.median(masked)


async def run(n: int, megabytes: int, docker: bool) -> None:
    timings = await end_to_end(n, megabytes, docker)
    stored = statistics.median(timings.pop("_bytes")) / 1e6
    print(f"a job printing {stored:.1f} MB, {len(VALUES)} env values, n={n} each, alternating")
    print(f"{'':<20}{'median s':>10}{'p90 s':>10}{'MB/s':>10}{'agent CPU s':>13}")
    for name, values in timings.items():
        if name.startswith("_"):
            continue
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        median = statistics.median(ordered)
        cpu = statistics.median(timings[f"_cpu {name}"])
        print(f"{name:<20}{median:>10.2f}{p90:>10.2f}{stored / median:>10.0f}{cpu:>13.2f}")
    plain, masked = in_process(megabytes, max(n, 3))
    print(
        f"in process, {megabytes} MB in 64 KiB chunks: LogStore {plain:.3f} s, "
        f"MaskedLog {masked:.3f} s ({masked / plain:.2f}x, "
        f"{megabytes / (masked - plain) if masked > plain else float('inf'):.0f} MB/s of masking)"
    )
    for runtime in ("process", "docker") if docker else ("process",):
        wall, cpu = (
            statistics.median(timings[f"{prefix}{runtime} secrets"])
            / statistics.median(timings[f"{prefix}{runtime} plain"])
            for prefix in ("", "_cpu ")
        )
        print(f"{runtime} runtime: secrets / plain = {wall:.3f}x wall, {cpu:.3f}x agent CPU")
    ratio = statistics.median(timings["process secrets"]) / statistics.median(
        timings["process plain"]
    )
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(
        f"job printing {stored:.0f} MB with {len(VALUES)} secrets: masked / plain = "
        f"{ratio:.3f}x (target <= {TARGET}: {verdict})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="samples per side")
    parser.add_argument("--mb", type=int, default=50, help="megabytes the job prints")
    parser.add_argument("--docker", action="store_true", help="also run it in a container")
    args = parser.parse_args()
    asyncio.run(run(args.n, args.mb, args.docker))


if __name__ == "__main__":
    main()
