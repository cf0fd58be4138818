"""Runs as Slurm jobs on a real cluster (slurmctld, one slurmd per namespace node), reached
through its login node over SSH: ranks and addresses of a multi-node run, a GPU partition,
queueing behind another job with Slurm's estimated start, a graceful stop, a node lost
mid-run, and removal leaving nothing in squeue."""

from __future__ import annotations

import asyncio
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import pytest
from pydantic import SecretStr

from dstack_plan.agent.api_models import JobSpec, JobStatus, TerminationReason
from dstack_plan.config.slurm_backend import SlurmCluster
from dstack_plan.providers.engine_jobs import EngineJobs
from dstack_plan.providers.slurm.engine import SlurmEngine
from dstack_plan.providers.slurm.login import LoginNode
from dstack_plan.providers.slurm.script import SlurmRequest
from dstack_plan.providers.ssh.pins import MemoryHostKeyStore

T = TypeVar("T")
READY = 90.0
"""Seconds a readiness wait allows (a loaded machine's slurmctld schedules every few s)."""


@pytest.fixture
def config(slurm_cluster, tmp_path: Path) -> SlurmCluster:
    """The backend config of the test cluster, its work directory this test's."""
    return SlurmCluster(
        name="test",
        hostname=slurm_cluster.login_address,
        user="root",
        identity_file=str(slurm_cluster.client_key),
        gpu_partitions=[{"gpu": "A100", "partitions": ["gpu"]}],
        cpu_partitions=["cpu"],
        work_dir=str(tmp_path / "work"),
    )


@asynccontextmanager
async def opened(config: SlurmCluster) -> AsyncIterator[SlurmEngine]:
    """An engine on the cluster; what its test left in Slurm is cancelled at the end."""
    pins = MemoryHostKeyStore()
    engine = SlurmEngine(LoginNode(config, pins))
    try:
        yield engine
    finally:
        for job in await engine.list_jobs():
            await engine.delete(job.id)
        await engine.close()
    assert pins.get(config.hostname), "the login node's host key was pinned"


def _specs(run: str, nodes: int, command: str, **fields: object) -> list[JobSpec]:
    return [
        JobSpec(id=f"{run}-0-{n}-1-dep", run_name=run, commands=[command], **fields)  # type: ignore[arg-type]
        for n in range(nodes)
    ]


async def _until(check: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """`check()` once `done` says so (a readiness poll: at most READY seconds)."""
    deadline = time.monotonic() + READY
    while True:
        info = await check()
        if done(info) or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.5)


async def test_a_two_node_run_learns_its_ranks_and_nodes_from_slurm(
    config: SlurmCluster, slurm_cluster, tmp_path: Path
) -> None:
    async with opened(config) as engine:
        command = (
            'echo "rank=$DSTACK_NODE_RANK of $DSTACK_NODES_NUM on $(hostname) '
            'master=$DSTACK_MASTER_NODE_IP job=$DSTACK_JOB_ID token=$TOKEN"; '
            'echo "ips=$(echo "$DSTACK_NODES_IPS" | paste -sd,)"'
        )
        specs = _specs("pair", 2, command, env={"TOKEN": SecretStr("s3cret-value")})
        submitted = await engine.submit(SlurmRequest(partition="cpu", nodes=2, mem_mb=200), specs)
        assert [j.status for j in submitted] == [JobStatus.SUBMITTED] * 2

        first = await _until(lambda: engine.get_job(specs[0].id), lambda i: i.finished)
        second = await engine.get_job(specs[1].id)
        assert (first.status, second.status) == (JobStatus.DONE, JobStatus.DONE)
        assert first.exit_code == 0 and second.exit_code == 0

        jobs = EngineJobs(engine)
        logs = [(await jobs.read_all_logs(s.id)).decode() for s in specs]
        cpu1, cpu2 = (f"{slurm_cluster.login_address.rsplit('.', 1)[0]}.{n}" for n in (11, 12))
        assert f"rank=0 of 2 on cpu1 master={cpu1} job={specs[0].id} token=s3cret-value" in logs[0]
        assert f"rank=1 of 2 on cpu2 master={cpu1} job={specs[1].id}" in logs[1]
        assert f"ips={cpu1},{cpu2}" in logs[0] and f"ips={cpu1},{cpu2}" in logs[1]

        # the secret is only in the job's env file, which only its owner may read
        job_dir = tmp_path / "work" / specs[0].id
        assert stat.S_IMODE((job_dir / "env.sh").stat().st_mode) == 0o600
        for name in ("meta.json", "job.sbatch", "node.sh"):
            assert "s3cret-value" not in (job_dir / name).read_text()
        assert first.spec["env"]["TOKEN"] == "(redacted)"


async def test_a_gpu_run_goes_to_the_gpu_partition_with_its_gres(config: SlurmCluster) -> None:
    async with opened(config) as engine:
        specs = _specs("gpus", 1, 'echo "on $(hostname) gpus=$DSTACK_GPUS_PER_NODE"', gpus=2)
        request = SlurmRequest(partition="gpu", gres="gpu:2", mem_mb=200)
        await engine.submit(request, specs)
        info = await _until(lambda: engine.get_job(specs[0].id), lambda i: i.finished)
        assert info.status is JobStatus.DONE
        output = (await EngineJobs(engine).read_all_logs(specs[0].id)).decode()
        assert "gpus=2" in output and ("on gpu1" in output or "on gpu2" in output)


async def test_a_run_queues_behind_another_with_slurms_estimated_start(
    config: SlurmCluster,
) -> None:
    async with opened(config) as engine:
        blocker = _specs("blocker", 2, "sleep 600")
        whole_nodes = SlurmRequest(partition="cpu", nodes=2, time_minutes=10, cpus_per_task=2)
        await engine.submit(whole_nodes, blocker)
        running = await _until(
            lambda: engine.get_job(blocker[0].id), lambda i: i.status is JobStatus.RUNNING
        )
        assert running.status is JobStatus.RUNNING

        waiting = SlurmRequest(partition="cpu", nodes=1, cpus_per_task=2, time_minutes=5)
        estimate = await engine.estimate(waiting)
        assert estimate.start is not None and estimate.start >= time.time() + 5 * 60, estimate
        queued = _specs("queued", 1, "true")
        await engine.submit(waiting, queued)
        assert (await engine.get_job(queued[0].id)).status is JobStatus.SUBMITTED

        await engine.delete(blocker[0].id)  # room again: the queued run starts and ends
        done = await _until(lambda: engine.get_job(queued[0].id), lambda i: i.finished)
        assert done.status is JobStatus.DONE


async def test_stop_sends_sigterm_and_kills_after_the_grace(config: SlurmCluster) -> None:
    async with opened(config) as engine:
        # the job ignores SIGTERM beyond saying so: only the kill after the grace ends it
        command = "trap 'echo got TERM' TERM; echo started; while true; do sleep 1; done"
        specs = _specs("stubborn", 1, command)
        await engine.submit(SlurmRequest(partition="cpu", mem_mb=200), specs)
        jobs = EngineJobs(engine)
        await _until(lambda: jobs.logs(specs[0].id), lambda c: b"started" in c.data)
        await jobs.stop(specs[0].id, timeout=3)
        ended = await jobs.wait(specs[0].id, timeout=READY)
        assert ended.status is JobStatus.TERMINATED
        assert ended.termination_reason is TerminationReason.TERMINATED_BY_USER
        assert "got TERM" in (await jobs.read_all_logs(specs[0].id)).decode()


async def test_a_node_set_down_mid_run_fails_it_with_slurms_reason(
    config: SlurmCluster, slurm_cluster
) -> None:
    async with opened(config) as engine:
        specs = _specs("lost", 2, "sleep 600")
        await engine.submit(SlurmRequest(partition="cpu", nodes=2, mem_mb=200), specs)
        await _until(lambda: engine.get_job(specs[0].id), lambda i: i.status is JobStatus.RUNNING)
        slurm_cluster.set_node_state("cpu2", "down", "fan failure")
        try:
            info = await _until(lambda: engine.get_job(specs[1].id), lambda i: i.finished)
            assert info.status is JobStatus.FAILED
            assert info.termination_message is not None
            assert "cpu2: fan failure" in info.termination_message
        finally:
            slurm_cluster.resume("cpu2")
            slurm_cluster.wait_nodes_idle()


async def test_delete_leaves_no_job_in_squeue(config: SlurmCluster, slurm_cluster) -> None:
    async with opened(config) as engine:
        specs = _specs("gone", 1, "sleep 600")
        await engine.submit(SlurmRequest(partition="cpu", mem_mb=200), specs)
        await _until(lambda: engine.get_job(specs[0].id), lambda i: i.status is JobStatus.RUNNING)
        await engine.delete(specs[0].id)
        assert await engine.list_jobs() == []

        async def active() -> str:
            return slurm_cluster.run("squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%j").stdout

        assert specs[0].id not in await _until(active, lambda names: specs[0].id not in names)
