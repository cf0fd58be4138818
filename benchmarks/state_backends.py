"""Commit latency and commits per second of the state backends, at 100 and 10,000 resources.

A commit is what apply and watch do after every change: read the state, change one resource,
write it back with compare-and-swap (`state.commit.commit`), a backup kept. Measured:
- `local`: the `.dstack/state.json` backend, in-process;
- `s3`: the S3 backend against moto's server on loopback (real HTTP, in this process's
  threads), with and without bucket versioning; and 20 concurrent writers (threads, one
  client each) committing different resources: commits per second, and whether any update
  was lost (the final state must hold every writer's last value, the serial one per commit);
- `terraform`: Terraform's local backend on an equivalent state (N `terraform_data`
  resources with inputs of the same size), where `terraform` is installed: `terraform state
  mv` of one resource, which reads, changes and writes the state with a backup, as a commit
  does; it includes Terraform's start-up, so the same operation through our CLI
  (`dstack state mv`) is measured beside it.

    python benchmarks/state_backends.py [--sizes 100 10000] [--commits 20] [--writers 20]

Targets: a local commit of a 10,000-resource state under 200 ms; 20 concurrent S3 writers lose
nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dstack_plan.state.backend import StateBackend  # noqa: E402
from dstack_plan.state.commit import commit  # noqa: E402
from dstack_plan.state.local import LocalBackend  # noqa: E402
from dstack_plan.state.model import ResourceState, State  # noqa: E402

TARGET_LOCAL_MS = 200.0
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
CLI = [sys.executable, "-m", "dstack_plan.cli"]


def resource(n: int) -> ResourceState:
    """A task of about 1 KB as apply records it: spec, two jobs, a price."""
    spec = {
        "type": "task",
        "name": f"task-{n}",
        "commands": [f"python train.py --shard {n}", "echo done"],
        "resources": {"cpu": "2..", "memory": "8GB..", "disk": "100GB..", "gpu": "A100:2"},
        "env": {"SEED": str(n), "MODEL": "llama-3-8b"},
    }
    jobs = [
        {"id": f"task-{n}-0-{j}-1-abc123", "host": "10.0.0.1", "replica": 0, "node": j,
         "status": "running", "runtime": "docker", "ports": []}
        for j in range(2)
    ]  # fmt: skip
    return ResourceState.create(
        f"task.task-{n}",
        provider="local",
        spec=spec,
        status="running",
        now=NOW,
        attributes={"jobs": jobs, "price_per_hour": 3.2, "fleet": "local"},
    )


def state_of(size: int) -> State:
    resources = {r.address: r for r in (resource(n) for n in range(size))}
    return State(lineage=str(uuid.uuid4()), serial=0, resources=resources)


def touch(address: str, value: int) -> Callable[[State], State]:
    """The mutation of one commit: one resource's attributes change."""

    def mutate(state: State) -> State:
        entry = state.resources[address]
        attributes = {**entry.attributes, "touched": value}
        return state.with_resource(entry.model_copy(update={"attributes": attributes}))

    return mutate


def commit_ms(backend: StateBackend, size: int, commits: int) -> float:
    """Median milliseconds per commit, each changing another resource."""
    times = []
    for i in range(commits):
        address = f"task.task-{(i * 7919) % size}"
        start = time.perf_counter()
        commit(backend, touch(address, i))
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def bench_local(size: int, commits: int, workdir: Path) -> float:
    backend = LocalBackend(workdir / f"local-{size}" / "state.json")
    backend.write(state_of(size), backend.read().version)
    return commit_ms(backend, size, commits)


class S3Bench:
    """moto's server, and S3 backends of buckets on it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        # werkzeug logs a line per request, and a traceback for each 500 moto's threaded server
        # answers when concurrent writers race on one key: the backend retries those (the
        # writers' row counts what is lost), so the tracebacks are moto's noise.
        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)

        os.environ.update(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_EC2_METADATA_DISABLED="true",
        )
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self._buckets = 0

    def bucket(self, versioning: bool) -> str:
        import boto3

        self._buckets += 1
        name = f"bench-{self._buckets}"
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=name)
        if versioning:
            status = {"Status": "Enabled"}
            client.put_bucket_versioning(Bucket=name, VersioningConfiguration=status)
        return name

    def backend(self, bucket: str) -> StateBackend:
        from dstack_plan.state.s3 import S3Backend
        from dstack_plan.state.s3_location import S3Location

        where = S3Location(bucket, "team/state.json", "us-east-1", self.endpoint)
        return S3Backend(where)

    def stop(self) -> None:
        self.server.stop()


def bench_s3(s3: S3Bench, size: int, commits: int, versioning: bool) -> float:
    backend = s3.backend(s3.bucket(versioning))
    backend.write(state_of(size), backend.read().version)
    return commit_ms(backend, size, commits)


def bench_writers(s3: S3Bench, writers: int, per_writer: int) -> tuple[float, int, str]:
    """Commits per second of `writers` threads each committing its own resource
    `per_writer` times; the updates lost (should be 0) and whether the serials add up."""
    bucket = s3.bucket(versioning=False)
    first = s3.backend(bucket)
    first.write(state_of(writers), first.read().version)
    start_serial = first.read().state.serial
    errors: list[str] = []

    def work(w: int) -> None:
        backend = s3.backend(bucket)
        try:
            for i in range(per_writer):
                commit(backend, touch(f"task.task-{w}", i))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"writer {w}: {e}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    final = first.read().state
    lost = sum(
        1
        for w in range(writers)
        if final.resources[f"task.task-{w}"].attributes.get("touched") != per_writer - 1
    )
    serials = final.serial - start_serial
    check = "ok" if serials == writers * per_writer else f"serial moved {serials}"
    if errors:
        check += f"; {len(errors)} writers failed: {errors[0]}"
    return writers * per_writer / elapsed, lost, check


def terraform_state(size: int) -> dict[str, Any]:
    """Terraform's state of `size` terraform_data resources, inputs of the same size as ours."""
    resources = []
    for n in range(size):
        ours = resource(n)
        value = {"spec": ours.spec, "attributes": ours.attributes}
        resources.append(
            {
                "mode": "managed",
                "type": "terraform_data",
                "name": f"r{n}",
                "provider": 'provider["terraform.io/builtin/terraform"]',
                "instances": [
                    {
                        "schema_version": 0,
                        "attributes": {
                            "id": str(uuid.UUID(int=n)),
                            "input": {"value": json.dumps(value), "type": "string"},
                            "output": {"value": json.dumps(value), "type": "string"},
                            "triggers_replace": None,
                        },
                        "sensitive_attributes": [],
                    }
                ],
            }
        )
    return {
        "version": 4,
        "terraform_version": "1.11.4",
        "serial": 1,
        "lineage": str(uuid.uuid4()),
        "outputs": {},
        "resources": resources,
        "check_results": None,
    }


def bench_terraform(size: int, repeats: int, workdir: Path) -> float | None:
    """Median ms of `terraform state mv` (one commit, start-up included); None if absent."""
    terraform = shutil.which("terraform")
    if terraform is None:
        return None
    directory = workdir / f"tf-{size}"
    directory.mkdir()
    (directory / "terraform.tfstate").write_text(json.dumps(terraform_state(size)))
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    times = []
    for i in range(repeats):
        src, dst = (f"terraform_data.r{i % size}", f"terraform_data.m{i}")
        start = time.perf_counter()
        done = subprocess.run(
            [terraform, "state", "mv", src, dst],
            cwd=directory, env=env, capture_output=True, text=True,
        )  # fmt: skip
        times.append((time.perf_counter() - start) * 1000)
        if done.returncode != 0:
            raise RuntimeError(f"terraform state mv failed: {done.stderr}")
    return statistics.median(times)


def bench_our_cli_mv(size: int, repeats: int, workdir: Path) -> float:
    """Median ms of `dstack state mv` on a local state (start-up included)."""
    directory = workdir / f"cli-{size}"
    backend = LocalBackend(directory / ".dstack" / "state.json")
    backend.write(state_of(size), backend.read().version)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env = {k: v for k, v in env.items() if k != "DSTACK_STATE"}
    times = []
    for i in range(repeats):
        src, dst = (f"task.task-{i % size}", f"task.moved-{i}")
        start = time.perf_counter()
        done = subprocess.run(
            [*CLI, "state", "mv", src, dst], cwd=directory, env=env, capture_output=True,
            text=True,
        )  # fmt: skip
        times.append((time.perf_counter() - start) * 1000)
        if done.returncode != 0:
            raise RuntimeError(f"dstack state mv failed: {done.stderr}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--writers", type=int, default=20)
    parser.add_argument("--per-writer", type=int, default=5)
    parser.add_argument("--cli-repeats", type=int, default=5)
    args = parser.parse_args()
    s3 = S3Bench()
    rows: list[tuple[str, int, float | None]] = []
    local_big = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            for size in args.sizes:
                local = bench_local(size, args.commits, workdir)
                local_big = local if size == max(args.sizes) else local_big
                repeats = args.cli_repeats
                rows += [
                    ("local (in-process commit)", size, local),
                    ("s3, moto (in-process)", size, bench_s3(s3, size, args.commits, False)),
                    ("s3 versioned, moto", size, bench_s3(s3, size, args.commits, True)),
                    ("dstack state mv (CLI)", size, bench_our_cli_mv(size, repeats, workdir)),
                    ("terraform state mv (CLI)", size, bench_terraform(size, repeats, workdir)),
                ]  # fmt: skip
            rate, lost, check = bench_writers(s3, args.writers, args.per_writer)
    finally:
        s3.stop()
    print(f"{'backend':34} {'resources':>9} {'ms/commit':>10} {'commits/s':>10}")
    for name, size, ms in rows:
        if ms is None:
            print(f"{name:34} {size:>9} {'(absent)':>10}")
            continue
        print(f"{name:34} {size:>9} {ms:>10.1f} {1000 / ms:>10.1f}")
    print(
        f"\n{args.writers} concurrent s3 writers x {args.per_writer} commits: "
        f"{rate:.1f} commits/s, {lost} updates lost, serials {check}"
    )
    ok = local_big is not None and local_big < TARGET_LOCAL_MS and lost == 0
    print(
        f"local commit at {max(args.sizes)} resources: {local_big:.1f} ms "
        f"(target < {TARGET_LOCAL_MS:g} ms); s3 writers lost {lost} (target 0): "
        f"{'met' if ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
