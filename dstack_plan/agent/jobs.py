"""The job manager: submit, track, stop and forget jobs; durable across agent restarts."""

from __future__ import annotations

import builtins
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable
from typing import Any

from dstack_plan.agent.blobs import BlobStore
from dstack_plan.agent.datadir import DataDir, read_json, write_json_atomic
from dstack_plan.agent.dockerlib import DockerEngine
from dstack_plan.agent.gpualloc import GpuAllocator, GpuUnavailable
from dstack_plan.agent.gpushare import mps_dirs, share_env, sharing_mode
from dstack_plan.agent.job import Job, StopRequest
from dstack_plan.agent.job_sshd import (
    SSHDError,
    SSHServer,
    has_sessions,
    sshd_alive,
    start_sshd,
    stop_sshd,
)
from dstack_plan.agent.logstore import LogStore
from dstack_plan.agent.protocol import (
    ABORTED_BY_USER,
    ALL_STATUSES,
    CONTAINER_EXITED_WITH_ERROR,
    DONE_BY_RUNNER,
    EXECUTOR_ERROR,
    INACTIVITY_DURATION_EXCEEDED,
    MAX_DURATION_EXCEEDED,
    PREEMPTED,
    RUNNING,
    RUNTIME_DOCKER,
    RUNTIME_PROCESS,
    SCALED_DOWN,
    STATUS_OF_REASON,
    TERMINATED_BY_SERVER,
    TERMINATED_BY_USER,
    TERMINATED_DUE_TO_UTILIZATION_POLICY,
    TERMINATING,
)
from dstack_plan.agent.runtimes.base import Runtime, StartError
from dstack_plan.agent.runtimes.docker_runtime import DockerRuntime
from dstack_plan.agent.runtimes.process_runtime import ProcessRuntime
from dstack_plan.agent.spec import JobSpec, parse_job_spec
from dstack_plan.agent.timers import Timers

log = logging.getLogger(__name__)

_STOP_MESSAGES = {
    TERMINATED_BY_USER: "stopped by user",
    ABORTED_BY_USER: "aborted by user",
    TERMINATED_BY_SERVER: "stopped by dstack watch",
    SCALED_DOWN: "scaled down",
    INACTIVITY_DURATION_EXCEEDED: "inactivity_duration exceeded",
    TERMINATED_DUE_TO_UTILIZATION_POLICY: "GPU utilization stayed under utilization_policy",
    PREEMPTED: "its capacity was reclaimed",
}
AGENT_STOPPED_MESSAGE = "agent stopped while the process was running"
FORCE_DELETE_WAIT = 15.0
SESSION_ACTIVITY_SAVE = 30.0
"""Seconds between writes of the activity an open SSH session makes (it is noted at once)."""


class ApiError(Exception):
    """An answer other than success: HTTP status, message, and the offending field if any."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        code: str = "error",
        details: dict[str, Any] | None = None,
    ):
        self.status = status
        self.field = field
        self.code = code
        self.details = details
        """More the client may act on (the owner of a claimed host), sent beside the rest."""
        super().__init__(message)


class JobManager:
    """All jobs of this agent. One lock guards job state; runtimes do slow work outside it."""

    def __init__(
        self,
        data: DataDir,
        agent_id: str,
        engine: DockerEngine,
        gpus: GpuAllocator,
        gpu_vendor: str | None,
        log_max_bytes: int,
        blobs: BlobStore | None = None,
    ):
        self._data = data
        self.blobs = blobs or BlobStore(data.blobs)
        self._agent_id = agent_id
        self._engine = engine
        self._gpus = gpus
        self.gpu_vendor = gpu_vendor
        self._log_max_bytes = log_max_bytes
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._jobs: dict[str, Job] = {}
        self._deadlines: dict[str, int] = {}
        self._timers = Timers()
        self._shutting_down = False
        self.runtimes: dict[str, Runtime] = {
            RUNTIME_PROCESS: ProcessRuntime(data.jobs, self.blobs),
            RUNTIME_DOCKER: DockerRuntime(engine, agent_id, log_max_bytes, self.blobs),
        }

    # -- persistence and recovery ----------------------------------------------------------

    def _persist(self, job: Job, outcome: bool = False) -> None:
        """Write `job`'s record atomically (a reader, or this agent's next start, sees the old
        one or the new one), fsynced only where it must outlive the host itself: a container's
        records (the container outlives a crash of the host, stopped, and its next start
        re-adopts it by the record) and every job's `outcome`.

        A process job's other records (submitted, started, its pid, a stop asked, activity)
        matter to this agent's next start after it died or was stopped while the host kept
        running, and the page cache holds them then. Should the host go down, the process
        goes with it: a record older than its last change is recovered as any unfinished job
        is (`recover`), and a job submitted in the host's last seconds may have none, so that
        the controller finds it gone, as it is. Its outcome is fsynced: a job that ended
        `done` just before must not read back as failed and be retried. (Two fsyncs a process
        job, under the lock, were about a fifth of the machine's busy time in an apply of
        1,000 of them.)"""
        # A job deleted meanwhile stays deleted: a late write (its thread marking it started
        # just after a forced delete) would bring its directory back.
        if self._jobs.get(job.id) is job:
            # Stopping, no record need survive a crash: the next start fails what it finds
            # unfinished, and thousands of fsyncs would outlast the stop's grace period.
            durable = (outcome or job.runtime == RUNTIME_DOCKER) and not self._shutting_down
            write_json_atomic(self._data.job_dir(job.id) / "job.json", job.record(), sync=durable)

    def _logs(self, job_id: str) -> LogStore:
        return LogStore(self._data.job_dir(job_id) / "logs", self._log_max_bytes)

    def recover(self) -> None:
        """Load job records after a start: re-adopt containers, fail orphaned processes."""
        for path in sorted(self._data.jobs.glob("*/job.json")):
            try:
                job = Job.from_record(read_json(path), self._logs(path.parent.name))
            except Exception as e:
                log.error("ignoring unreadable job record %s: %s", path, e)
                continue
            with self._lock:
                self._jobs[job.id] = job
            if job.finished:
                job.logs.close()
                stop_sshd(job.sshd)  # left by an agent that died as the job ended
                continue
            self._gpus.claim(job.id, job.gpus, job.spec.gpu_share)
            if job.runtime == RUNTIME_PROCESS:
                runtime = self.runtimes[RUNTIME_PROCESS]
                assert isinstance(runtime, ProcessRuntime)
                runtime.kill_orphan(job)
                when = "while the process was running" if job.started else "before it started"
                self.finish(job, EXECUTOR_ERROR, f"agent restarted {when}")
            else:
                log.info("re-adopting job %s", job.id)
                self._start_thread(job, adopt=True)

    # -- the JobControl interface runtimes use ---------------------------------------------

    def set_status(self, job: Job, status: str) -> None:
        with self._lock:
            if not job.finished:
                job.status = status
                self._persist(job)
                self._changed.notify_all()

    def set_handles(self, job: Job, **handles: Any) -> StopRequest | None:
        with self._lock:
            for name, value in handles.items():
                setattr(job, name, value)
            self._persist(job)
            return job.stop

    def mark_started(self, job: Job, **handles: Any) -> StopRequest | None:
        with self._lock:
            for name, value in handles.items():
                setattr(job, name, value)
            job.started = True
            if not job.finished:
                job.status = TERMINATING if job.stop else RUNNING
                job.started_at = job.started_at or time.time()
                job.last_activity_at = job.last_activity_at or job.started_at
                if job.spec.max_duration and job.id not in self._deadlines:
                    when = job.started_at + job.spec.max_duration
                    self._deadlines[job.id] = self._timers.call_at(
                        when, lambda: self._max_duration_exceeded(job.id)
                    )
            self._persist(job)
            self._changed.notify_all()
            stop = job.stop
            wants_sshd = job.spec.ssh is not None and not job.finished and stop is None
        if wants_sshd:
            self._ensure_sshd(job)
        return stop

    def _ensure_sshd(self, job: Job) -> None:
        """Start the job's SSH server beside it (a re-adopted job keeps the one it had)."""
        if sshd_alive(job.sshd):
            return
        threading.Thread(
            target=self._start_sshd, args=(job,), name=f"sshd-{job.id}", daemon=True
        ).start()

    def _start_sshd(self, job: Job) -> None:
        assert job.spec.ssh is not None
        try:
            target = self.runtimes[job.runtime].session_target(job)
            server = start_sshd(
                self._data.job_dir(job.id) / "sshd", job.spec.ssh.public_key, target
            )
        except (SSHDError, StartError, OSError, subprocess.SubprocessError) as e:
            log.warning("job %s: no SSH server: %s", job.id, e)
            server = SSHServer(error=str(e))
        with self._lock:
            if job.finished or self._jobs.get(job.id) is not job:
                ended = True
            else:
                ended = False
                job.sshd = server
                self._persist(job)
                self._changed.notify_all()
        if ended:
            stop_sshd(server)  # the job ended while it started
        else:
            log.info("job %s: SSH server on 127.0.0.1:%s", job.id, server.port)

    def append_log(
        self, job: Job, data: bytes, cursor: str | None = None, stream: str = "out"
    ) -> None:
        job.output.append(data, cursor, stream)

    # -- running ---------------------------------------------------------------------------

    def _start_thread(self, job: Job, adopt: bool = False) -> None:
        threading.Thread(
            target=self._run_job, args=(job, adopt), name=f"job-{job.id}", daemon=True
        ).start()

    def _run_job(self, job: Job, adopt: bool) -> None:
        runtime = self.runtimes[job.runtime]
        code: int | None = None
        failure: tuple[str, str] | None = None
        try:
            code = runtime.adopt(job, self) if adopt else runtime.run(job, self)
        except StartError as e:
            failure = (e.reason, str(e))
        except Exception as e:
            log.exception("job %s: runtime failed", job.id)
            failure = (EXECUTOR_ERROR, f"agent error: {type(e).__name__}: {e}")
        # Clean up before reporting the end: a finished job has let go of what it held.
        if not self._shutting_down:
            try:
                runtime.cleanup(job)
            except Exception:
                log.exception("job %s: cleanup failed", job.id)
        if self._shutting_down and job.runtime == RUNTIME_PROCESS:
            # The stop killed it, and shutdown() records that once every process is gone:
            # recording here could come before the last kill, and say "exited with code -9".
            return
        if failure is not None:
            self.finish(job, *failure)
        else:
            self._finish_exited(job, code or 0)

    def _finish_exited(self, job: Job, code: int) -> None:
        with self._lock:
            stop = job.stop
        if stop is not None:
            self.finish(job, stop.reason, self._stop_message(job, stop), code)
        elif code == 0:
            self.finish(job, DONE_BY_RUNNER, None, 0)
        else:
            self.finish(job, CONTAINER_EXITED_WITH_ERROR, f"exited with code {code}", code)

    @staticmethod
    def _stop_message(job: Job, stop: StopRequest) -> str:
        if stop.reason == MAX_DURATION_EXCEEDED:
            return f"max_duration of {job.spec.max_duration:g}s exceeded"
        return _STOP_MESSAGES.get(stop.reason, stop.reason)

    def finish(
        self, job: Job, reason: str, message: str | None, exit_code: int | None = None
    ) -> bool:
        """End a job with `reason` (first call wins); frees its GPUs."""
        # What masking held back goes to the log before anyone can see the job finished (a
        # reader that saw it finished takes the end of the log for the end of its output).
        job.output.flush()
        with self._lock:
            if job.finished:
                return False
            job.status = STATUS_OF_REASON[reason]
            job.termination_reason = reason
            job.termination_message = message
            job.exit_code = exit_code
            job.finished_at = time.time()
            self._gpus.release(job.id)
            handle = self._deadlines.pop(job.id, None)
            if handle is not None:
                self._timers.cancel(handle)
            # a finished job has no SSH server to reach (gone before anyone sees it finished)
            stop_sshd(job.sshd)
            job.sshd = None
            if job.id in self._jobs:
                self._persist(job, outcome=True)
            self._changed.notify_all()
        job.logs.close()
        log.info("job %s %s (%s)", job.id, job.status, reason)
        return True

    def _max_duration_exceeded(self, job_id: str) -> None:
        try:
            self.stop(job_id, reason=MAX_DURATION_EXCEEDED)
        except ApiError:
            pass  # deleted meanwhile

    # -- the API ---------------------------------------------------------------------------

    def submit(self, payload: Any) -> tuple[int, dict[str, Any]]:
        """Validate and start a job; (201, info), or (200, info) for a repeated identical one."""
        spec = parse_job_spec(payload)
        self._check_code(spec.code)
        runtime = RUNTIME_DOCKER if spec.image else RUNTIME_PROCESS
        if runtime == RUNTIME_DOCKER and self._engine.client() is None:
            raise ApiError(
                422,
                f"image: this host cannot run images ({self._engine.error})",
                "image",
                "no_docker",
            )
        with self._lock:
            self._check_code(spec.code)  # again: a delete removes an unused blob under the lock
            existing = self._jobs.get(spec.id)
            if existing is not None:
                if existing.spec.to_dict() == spec.to_dict():
                    return 200, existing.info()  # a retried submit: same job, not a new one
                raise ApiError(
                    409, f"id: a different job with id {spec.id} exists", "id", "conflict"
                )
            # the host's ports are arbitrated here as its GPUs are: two projects placing on
            # this host at one moment both saw them free; the second is told, not started
            taken = self._ports_taken(spec)
            if taken:
                held = ", ".join(f"{port} (job {job})" for port, job in sorted(taken.items()))
                raise ApiError(
                    409, f"ports: host ports in use: {held}", "ports", "ports_unavailable"
                )
            try:
                request = spec.gpus if isinstance(spec.gpus, tuple) else spec.gpu_count
                gpus = self._gpus.allocate(spec.id, request, spec.gpu_share)
            except GpuUnavailable as e:
                raise ApiError(e.status, str(e), "gpus", "gpus_unavailable") from e
            # How a share is enforced is decided once, here, and kept in the record.
            dirs = mps_dirs()
            sharing = sharing_mode(spec.gpu_share, self.gpu_vendor, dirs)
            memory = self._gpus.memory_mib(gpus[0]) if gpus else None
            try:
                self._data.job_dir(spec.id).mkdir(parents=True, exist_ok=True)
                job = Job(
                    spec=spec,
                    runtime=runtime,
                    logs=self._logs(spec.id),
                    gpus=gpus,
                    gpu_vendor=self.gpu_vendor,
                    gpu_sharing=sharing,
                    gpu_share_env=share_env(spec.gpu_share, sharing, memory, dirs),
                    container_name=(
                        f"dstack-{self._agent_id[:8]}-{spec.id}"
                        if runtime == RUNTIME_DOCKER
                        else None
                    ),
                )
                self._jobs[spec.id] = job
                self._persist(job)
            except BaseException:
                self._gpus.release(spec.id)
                self._jobs.pop(spec.id, None)
                raise
        self._start_thread(job)
        return 201, job.info()

    def _check_code(self, code: str | None) -> None:
        if code is not None and not self.blobs.has(code):
            raise ApiError(
                400,
                f"code: no uploaded archive {code}; upload it first (PUT /blobs/{code})",
                "code",
                "missing_code",
            )

    def get(self, job_id: str) -> Job:
        """The job, or a 404 ApiError."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"no job with id {job_id!r}", None, "not_found")
        return job

    def list(
        self, status: str | None = None, run_name: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Info of all jobs, oldest first, optionally filtered."""
        if status is not None and status not in ALL_STATUSES:
            raise ApiError(400, f"status: unknown status {status!r}", "status")
        with self._lock:
            jobs = sorted(self._jobs.values(), key=lambda j: j.submitted_at)
        self._note_sessions(jobs)
        with self._lock:
            return [
                j.info()
                for j in jobs
                if (status is None or j.status == status)
                and (run_name is None or j.spec.run_name == run_name)
            ]

    def info(self, job_id: str, wait: float = 0.0) -> dict[str, Any]:
        """Info of one job; with `wait`, once it has finished or after that many seconds,
        whichever comes first (a caller waiting for a stop asks once, not every 100 ms)."""
        job = self.get(job_id)
        self._note_sessions([job])
        with self._lock:
            if wait > 0:
                self._changed.wait_for(lambda: job.finished, wait)
            return job.info()

    def _note_sessions(self, jobs: Iterable[Job]) -> None:
        """An SSH session open into a job (an IDE, `ssh <run>`) is activity, as a touch is:
        noted whenever someone asks about the job (watch does every tick), and written to the
        record at most every SESSION_ACTIVITY_SAVE seconds."""
        with_sessions = [j for j in jobs if j.sshd is not None and not j.finished]
        with_sessions = [j for j in with_sessions if has_sessions(j.sshd)]
        if not with_sessions:
            return
        now = time.time()
        with self._lock:
            for job in with_sessions:
                if job.finished:
                    continue
                job.last_activity_at = max(job.last_activity_at or 0.0, now)
                if now - job.activity_saved_at >= SESSION_ACTIVITY_SAVE:
                    job.activity_saved_at = now
                    self._persist(job)

    def stop(
        self,
        job_id: str,
        timeout: float | None = None,
        abort: bool = False,
        reason: str = TERMINATED_BY_USER,
    ) -> dict[str, Any]:
        """Stop a job gracefully (SIGTERM, SIGKILL after the timeout) or abort it at once."""
        job = self.get(job_id)
        if abort:
            reason = ABORTED_BY_USER
        with self._lock:
            if job.finished or (job.stop and (not abort or job.stop.reason == ABORTED_BY_USER)):
                return job.info()
            timeout = job.spec.stop_timeout if timeout is None else timeout
            job.stop = StopRequest(reason, timeout, time.time())
            if not job.started:
                # Nothing runs yet; the job thread sees the job ended and starts nothing.
                self.finish(job, reason, self._stop_message(job, job.stop))
                return job.info()
            job.status = TERMINATING
            self._persist(job)
            info = job.info()
        runtime = self.runtimes[job.runtime]
        action = runtime.kill if abort else (lambda j: runtime.stop(j, timeout))
        threading.Thread(target=action, args=(job,), name=f"stop-{job.id}", daemon=True).start()
        return info

    def stop_and_delete(
        self, job_id: str, timeout: float | None, reason: str, hold: float
    ) -> tuple[bool, dict[str, Any]]:
        """Stop a job gracefully and, once it has ended (waited for up to `hold` seconds),
        forget it: (True, how it ended); (False, its info) when it still runs after `hold`.
        One request where a caller removing a job would otherwise make three."""
        job = self.get(job_id)
        self.stop(job_id, timeout, reason=reason)
        with self._lock:
            if not self._changed.wait_for(lambda: job.finished, hold):
                return False, job.info()
            info = job.info()
        try:
            self.delete(job_id)
        except ApiError as e:
            if e.status != 404:  # deleted meanwhile is deleted
                raise
        return True, info

    def _ports_taken(self, spec: JobSpec) -> dict[int, str]:
        """The host ports `spec` binds that an unfinished job of another run binds already
        (port -> its job id). A job of the same run (its labels' deployment and address: an
        older generation, which a create-before-destroy replacement keeps until the new one
        runs) is the caller's to order, as placement leaves a run's own jobs out. Called under
        the lock."""
        wanted = _host_ports(spec)
        if not wanted:
            return {}
        run = _run_of(spec)
        taken: dict[int, str] = {}
        for job in self._jobs.values():
            if job.finished or (run is not None and _run_of(job.spec) == run):
                continue
            published = {p.get("host_port") for p in job.ports}
            held = _host_ports(job.spec) | {p for p in published if isinstance(p, int)}
            for port in held & wanted:
                taken[port] = job.id
        return taken

    def touch(self, job_id: str) -> dict[str, Any]:
        """Record that someone uses the job now (`last_activity_at`: what watch's
        inactivity_duration counts from); a finished job is left as it is."""
        job = self.get(job_id)
        with self._lock:
            if not job.finished:
                job.last_activity_at = max(job.last_activity_at or 0.0, time.time())
                self._persist(job)
            return job.info()

    def delete(self, job_id: str, force: bool = False) -> None:
        """Forget a finished job: its record, logs and container. `force` aborts it first."""
        job = self.get(job_id)
        if not job.finished:
            if not force:
                raise ApiError(
                    409,
                    f"job {job_id} is {job.status}; stop it first or delete with force=1",
                    None,
                    "job_active",
                )
            self.stop(job_id, abort=True)
            with self._lock:
                if not self._changed.wait_for(lambda: job.finished, FORCE_DELETE_WAIT):
                    raise ApiError(
                        409,
                        f"job {job_id} did not end within {FORCE_DELETE_WAIT:g}s",
                        None,
                        "job_active",
                    )
        with self._lock:
            self._jobs.pop(job_id, None)
            code = job.spec.code
            if code is not None and all(j.spec.code != code for j in self._jobs.values()):
                self.blobs.remove(code)  # its last job: the host keeps no copy of the files
        self.runtimes[job.runtime].cleanup(job)
        shutil.rmtree(self._data.job_dir(job_id), ignore_errors=True)

    def counts(self) -> dict[str, int]:
        """Number of jobs in each status."""
        counts = {s: 0 for s in ALL_STATUSES}
        with self._lock:
            for job in self._jobs.values():
                counts[job.status] = counts.get(job.status, 0) + 1
        return counts

    def shutdown(self) -> None:
        """The agent is stopping: containers keep running; processes cannot, so they end."""
        with self._lock:
            self._shutting_down = True
            active = [
                j for j in self._jobs.values() if not j.finished and j.runtime == RUNTIME_PROCESS
            ]
        # Every process goes before any record is written: with thousands of jobs the records
        # take longer than a stop waits before SIGKILL, and a job must not outlive the agent
        # because its record came late (the next start fails what is left unrecorded).
        for job in active:
            self.runtimes[RUNTIME_PROCESS].shutdown(job)
        for job in active:
            self.finish(job, EXECUTOR_ERROR, AGENT_STOPPED_MESSAGE)


def _host_ports(spec: JobSpec) -> set[int]:
    """The host ports a job binds: every port on the host network, else those it publishes
    on a fixed host port (Docker picks the others)."""
    if spec.network_mode == "host":
        return {p.container_port for p in spec.ports}
    return {p.host_port for p in spec.ports if p.host_port is not None}


def _run_of(spec: JobSpec) -> tuple[str, str] | None:
    """(deployment, address) of the run a job belongs to, from its labels; None without."""
    deployment, address = spec.labels.get("deployment"), spec.labels.get("address")
    return (deployment, address) if deployment and address else None
