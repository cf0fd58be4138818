"""Runs as Slurm jobs: submitted, listed, stopped, read and removed through the login node.

Where the other providers hand a run's jobs to our agent on each machine, a Slurm cluster
runs them itself: `SlurmEngine` speaks the job half of the agent's interface (`JobInfo`
answers, our job ids, logs by offset) on top of `sbatch`, `squeue` and `scancel`, so what reads
jobs (refresh, watch, `ps`, `logs`) reads a Slurm run's the same way. A run's nodes are one
Slurm job (`providers/slurm/script.py`); each node is one of our jobs, with its own id, log
and exit code.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import shlex
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dstack_plan.agent.api_models import JobInfo, JobSpec, JobStatus, PublishedPort
from dstack_plan.agent.spec import JobSpec as CheckedSpec
from dstack_plan.clock import Clock, SystemClock
from dstack_plan.errors import AgentError, SSHError
from dstack_plan.providers.engine_jobs import LOG_CHUNK, EngineJobs, checked_spec
from dstack_plan.providers.slurm import script
from dstack_plan.providers.slurm.listing import (
    JOB_NAME_PREFIX,
    META,
    STOPPED,
    JobDir,
    Listing,
    listing_command,
    parse_listing,
)
from dstack_plan.providers.slurm.login import LoginNode, shell_path
from dstack_plan.providers.slurm.partitions import Partition, parse_nodes, partitions_of
from dstack_plan.providers.slurm.states import node_outcome, slurm_time

if TYPE_CHECKING:
    from dstack_plan.providers.ssh.forward import Forward


@dataclass(frozen=True)
class Estimate:
    """What `sbatch --test-only` says of a request: when and where it would start."""

    start: float | None
    nodes: str | None
    message: str


class SlurmEngine:
    """The jobs of one cluster, through its login node."""

    def __init__(self, login: LoginNode, clock: Clock | None = None):
        self.login = login
        self.cluster = login.cluster
        self.clock = clock or SystemClock()
        self._home_dir: str | None = None

    @property
    def name(self) -> str:
        return self.login.name

    unreachable: tuple[type[Exception], ...] = (SSHError,)
    """A login node that does not answer: the cluster's jobs are not known, not gone."""

    def jobs(self) -> EngineJobs:
        """The cluster's jobs behind the job half of the agent's interface."""
        return EngineJobs(self)

    def job_dir(self, key: str) -> str:
        """The directory of job `key` on the login node, as a shell word."""
        return f"{shell_path(self.cluster.work_dir)}/{shlex.quote(key)}"

    async def submit(
        self,
        request: script.SlurmRequest,
        specs: Sequence[JobSpec],
        container: script.Container | None = None,
    ) -> list[JobInfo]:
        """Submit one run's jobs (`specs`, one per node, node 0 first) as one Slurm job:
        their answers as the agent would give them, all `submitted`.

        The job's files go in one `tar` over SSH (its env, secrets included, only ever on
        stdin and in a 0600 file), then `sbatch`; a submit refused by Slurm (no such
        partition, a request no node can meet) is an SSHError with Slurm's words."""
        if not specs:
            return []
        key = specs[0].id
        ids = [s.id for s in specs]
        first = checked_spec(specs[0], "slurm")
        now = self.clock.now()
        home = await self._home()
        work = _absolute(self.cluster.work_dir, home)
        directory = f"{work}/{key}"
        gpus = first.gpu_count
        request = dataclasses.replace(request, job_name=JOB_NAME_PREFIX + key)
        meta = {
            "ids": ids,
            "run_name": first.run_name,
            "run_id": first.run_id,
            "submitted_at": now,
            "partition": request.partition,
            "spec": first.to_dict(redact=True),
        }
        files = {
            script.SCRIPT: (script.batch_script(request, directory, container), 0o700),
            script.NODE: (
                script.node_script(directory, first.commands, ids, gpus, first.working_dir),
                0o700,
            ),
            script.ENV: (script.env_script(_node_env(first)), 0o600),
            META: (json.dumps(meta, sort_keys=True), 0o600),
        }
        command = (
            f"umask 077 && mkdir -p {shlex.quote(directory)} && "
            f"tar -x -f - -C {shlex.quote(directory)} && "
            f"sbatch --parsable {shlex.quote(directory + '/' + script.SCRIPT)}"
        )
        ran = await self.login.run(command, f"submitting {key} to Slurm", stdin=_tar(files))
        slurm_id = ran.out.strip().split(";")[0]
        if not slurm_id.isdigit():
            raise SSHError(self.name, f"sbatch answered {ran.out.strip()!r} instead of a job id")
        spec = first.to_dict(redact=True)
        return [
            JobInfo(
                id=job_id,
                run_name=first.run_name,
                run_id=first.run_id,
                runtime="process",
                status=JobStatus.SUBMITTED,
                submitted_at=now,
                spec=spec,
            )
            for job_id in ids
        ]

    async def listing(self) -> Listing:
        """Everything the cluster says of our jobs, in one command."""
        ran = await self.login.run(listing_command(self.cluster.work_dir), "listing jobs in Slurm")
        listing = parse_listing(ran.out)
        if listing.squeue_error is not None:
            raise SSHError(self.name, f"squeue failed: {listing.squeue_error}")
        return listing

    async def list_jobs(self, run_name: str | None = None) -> list[JobInfo]:
        """Our jobs on the cluster (only `run_name`'s when given), oldest first."""
        listing = await self.listing()
        found: list[JobInfo] = []
        for job in listing.jobs.values():
            if run_name is not None and job.meta.get("run_name") != run_name:
                continue
            found += _infos(job, listing)
        return sorted(found, key=lambda i: (i.submitted_at, i.id))

    async def get_job(self, job_id: str) -> JobInfo:
        """Job `job_id` as it stands; AgentError 404 when the cluster has no such job."""
        for info in await self.list_jobs():
            if info.id == job_id:
                return info
        raise AgentError(self.name, f"no job {job_id}", status=404, code="not_found")

    async def stop(self, job_id: str, timeout: float, abort: bool = False) -> JobInfo:
        """Stop the Slurm job `job_id` belongs to (all its nodes) and return at once: SIGTERM
        to every node's commands now, Slurm's cancel (SIGKILL after the site's KillWait)
        `timeout` seconds later unless they ended. The later cancel is left to the login node
        (a detached `sleep; scancel`), so the stop completes when no command of ours runs any
        more, as an agent's does. A pending job, or one stopped with `abort`, is cancelled
        at once."""
        key, listing = await self._key_of(job_id)
        queued = listing.queued.get(key)
        touch = f"touch {self.job_dir(key)}/{STOPPED}"
        if queued is None or queued.ended:
            await self.login.run(touch, f"stopping {job_id}")
        elif queued.state == "PENDING" or abort or timeout <= 0:
            await self.login.run(
                f"{touch}; scancel {queued.slurm_id}", f"cancelling Slurm job {queued.slurm_id}"
            )
        else:
            later = shlex.quote(f"sleep {math.ceil(timeout)}; scancel {queued.slurm_id}")
            await self.login.run(
                f"{touch}; scancel --signal=TERM {queued.slurm_id}; "
                f"nohup sh -c {later} >/dev/null 2>&1 &",
                f"signalling Slurm job {queued.slurm_id}",
            )
        return await self.get_job(job_id)

    async def delete(self, job_id: str) -> None:
        """Remove job `job_id`'s Slurm job and its directory (its env file with it): cancelled
        first when it still runs. A job that is gone already is no error."""
        try:
            key, listing = await self._key_of(job_id)
        except AgentError as e:
            if e.status == 404:
                return
            raise
        queued = listing.queued.get(key)
        cancel = f"scancel {queued.slurm_id}; " if queued is not None and not queued.ended else ""
        await self.login.run(f"{cancel}rm -rf {self.job_dir(key)}", f"removing {job_id}")

    async def logs(
        self, job_id: str, offset: int = 0, limit: int = LOG_CHUNK
    ) -> tuple[bytes, int, bool]:
        """Up to `limit` bytes of job `job_id`'s output (its node's log) from `offset`: (the
        bytes, the log's size, whether the job has ended)."""
        key, listing = await self._key_of(job_id)
        job = listing.jobs[key]
        node = job.job_ids.index(job_id)
        info = next(i for i in _infos(job, listing) if i.id == job_id)
        size = job.log_sizes.get(node, 0)
        if offset >= size:
            return b"", size, info.finished
        path = f"{self.job_dir(key)}/{script.LOG.format(node=node)}"
        ran = await self.login.run(
            f"tail -c +{offset + 1} {path} | head -c {min(limit, size - offset)}",
            f"reading the output of {job_id}",
        )
        return ran.stdout, size, info.finished

    async def estimate(self, request: script.SlurmRequest) -> Estimate:
        """When Slurm would start `request` now (`sbatch --test-only`: nothing is queued)."""
        options = " ".join(shlex.quote(o) for o in request.options())
        ran = await self.login.run(
            f"sbatch --test-only {options} --wrap=true",
            "asking Slurm when a run would start",
            ok=(0, 1),
        )
        said = (ran.stderr or ran.out).strip()
        if ran.status != 0:
            return Estimate(None, None, said.splitlines()[-1] if said else "refused")
        return _estimate(said)

    async def partitions(self) -> list[Partition]:
        """The partitions the backend config lets runs use, as their nodes are now."""
        ran = await self.login.run("scontrol show node -o", "reading the cluster's nodes")
        return partitions_of(self.cluster, parse_nodes(ran.out))

    async def forward(self, address: str, port: int, local_port: int = 0) -> Forward:
        """`address`:`port` (a compute node's, where a service's replica listens) on this
        machine's 127.0.0.1, through the login node's SSH connection."""
        from dstack_plan.providers.ssh.forward import open_forward

        conn = await self.login.connection()
        return await open_forward(conn, address, port, local_port, remote_address=address)

    async def close(self) -> None:
        await self.login.close()

    async def _key_of(self, job_id: str) -> tuple[str, Listing]:
        listing = await self.listing()
        for key, job in listing.jobs.items():
            if job_id in job.job_ids:
                return key, listing
        raise AgentError(self.name, f"no job {job_id}", status=404, code="not_found")

    async def _home(self) -> str:
        if self._home_dir is None:
            ran = await self.login.run('printf %s "$HOME"', "reading the home directory")
            self._home_dir = ran.out.strip()
        return self._home_dir


def _absolute(path: str, home: str) -> str:
    """`path` on the login node without `~` or relativity: the scripts run on compute nodes,
    whose shells start elsewhere."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return f"{home}/{path[2:]}"
    return path if path.startswith("/") else f"{home}/{path}"


def _node_env(spec: CheckedSpec) -> dict[str, str]:
    """The job's env without what each node sets from Slurm's variables."""
    return {k: v for k, v in spec.env.items() if k not in script.PER_NODE_VARS}


def _tar(files: dict[str, tuple[str, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, (text, mode) in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _infos(job: JobDir, listing: Listing) -> list[JobInfo]:
    """Each node of job directory `job` as a JobInfo."""
    queued = listing.queued.get(job.key)
    meta = job.meta
    submitted = float(meta.get("submitted_at") or 0.0)
    recorded = meta.get("spec")
    spec: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    infos = []
    for node, job_id in enumerate(job.job_ids):
        outcome = node_outcome(queued, job.exits.get(node), job.stopped, listing.down)
        started = queued.start if queued is not None and queued.state != "PENDING" else None
        finished = queued.end if outcome.status.finished and queued is not None else None
        ports: list[PublishedPort] = []
        if outcome.status is JobStatus.RUNNING and queued is not None and node < len(queued.nodes):
            # the job runs on the node's own network: its ports are the node's
            name = queued.nodes[node]
            ports = _ports(spec, listing.addresses.get(name, name))
        infos.append(
            JobInfo(
                id=job_id,
                run_name=str(meta.get("run_name") or ""),
                run_id=meta.get("run_id"),
                runtime="process",
                status=outcome.status,
                termination_reason=outcome.reason,
                termination_message=outcome.message,
                exit_code=outcome.exit_code,
                submitted_at=submitted,
                started_at=started,
                finished_at=finished,
                log_size=job.log_sizes.get(node, 0),
                ports=ports,
                spec=spec,
            )
        )
    return infos


def _ports(spec: dict[str, Any], address: str) -> list[PublishedPort]:
    declared = spec.get("ports")
    found = []
    for port in declared if isinstance(declared, list) else []:
        number = port.get("container_port") if isinstance(port, dict) else None
        if isinstance(number, int):
            found.append(PublishedPort(container_port=number, host_port=number, host_ip=address))
    return found


def _estimate(said: str) -> Estimate:
    """`sbatch: Job 12 to start at 2026-12-07T10:00:00 using 2 processors on nodes cpu[1-2]
    in partition cpu` as an Estimate."""
    words = said.split()
    start = None
    nodes = None
    if "at" in words:
        start = (
            slurm_time(words[words.index("at") + 1])
            if words.index("at") + 1 < len(words)
            else None
        )
    if "nodes" in words and words.index("nodes") + 1 < len(words):
        nodes = words[words.index("nodes") + 1]
    return Estimate(start, nodes, said.splitlines()[-1] if said else "")
