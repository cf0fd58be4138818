"""Jobs without an image: `sh -c` (or, for one plain command, the program itself:
`runtimes/direct_exec.py`) in their own session, output captured through a pipe.

Such a job cannot outlive the agent (its output pipe and exit status belong to the agent), so
after a restart it is failed rather than re-adopted, and its leftover processes are killed.
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from dstack_plan.agent.blobs import ABS, HOME, WD, BlobStore, UnpackError, unpack
from dstack_plan.agent.job import Job
from dstack_plan.agent.proctree import process_start_ticks
from dstack_plan.agent.protocol import EXECUTOR_ERROR, REDACTED, RUNTIME_PROCESS
from dstack_plan.agent.runtimes.base import JobControl, Runtime, StartError, host_network_ports
from dstack_plan.agent.runtimes.child_exit import (
    Pidfds,
    drain,
    pump_until_exit,
    read_to_end,
)
from dstack_plan.agent.runtimes.direct_exec import direct_argv

log = logging.getLogger(__name__)

DRAIN_SECONDS = 5.0
"""How long a job's output is still read after its group is gone: a process that left the
group holding the pipe would otherwise keep its reader for as long as it runs."""
_VISIBLE_DEVICES = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
}


def kill_group(pgid: int | None, sig: int) -> None:
    """Signal a process group, ignoring one that is already gone."""
    if not pgid:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def job_argv(job: Job) -> list[str]:
    """The entrypoint followed by the commands as arguments, else the commands via `sh -c`."""
    spec = job.spec
    if spec.entrypoint:
        return [*spec.entrypoint, *spec.commands]
    return ["/bin/sh", "-c", " && ".join(spec.commands)]


def _argvs(job: Job, env: dict[str, str], cwd: Path) -> list[list[str]]:
    """What to try executing, in order: the command without a shell where it needs none,
    then `job_argv` (a program the kernel will not execute, a script without `#!`, is then
    the shell's to run or report, as it would have been)."""
    argv = job_argv(job)
    direct = None if job.spec.entrypoint else direct_argv(job.spec.commands, env.get("PATH"), cwd)
    return [direct, argv] if direct is not None else [argv]


def _account(user: str | None) -> pwd.struct_passwd | None:
    """The passwd entry of a job's `user[:group]` (name or uid), or this agent's own."""
    name = (user or "").partition(":")[0]
    try:
        if not name:
            return pwd.getpwuid(os.geteuid())
        return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        return None


def gpu_env(vendor: str | None, indices: list[int]) -> dict[str, str]:
    """Visible-device variables restricting the job to its GPUs (empty on a GPU-less host)."""
    if vendor is None:
        return {}
    value = ",".join(str(i) for i in indices)
    return {name: value for name in _VISIBLE_DEVICES.get(vendor, ())}


class ProcessRuntime(Runtime):
    name = RUNTIME_PROCESS

    def __init__(self, jobs_dir: Path, blobs: BlobStore | None = None):
        self._jobs_dir = jobs_dir
        self._blobs = blobs
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._pidfds = Pidfds()

    def _working_dir(self, job: Job) -> Path:
        base = self._jobs_dir / job.id / "work"
        wanted = job.spec.working_dir
        if wanted and wanted.startswith("/"):
            return Path(wanted)
        path = base / wanted if wanted else base
        path.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, job: Job, ctl: JobControl) -> int:
        if job.finished:
            return 0  # stopped before it started
        env = dict(os.environ)
        env.update(job.spec.env)
        env.update(gpu_env(job.gpu_vendor, job.gpus))
        env.update(job.gpu_share_env)  # a shared GPU: DSTACK_GPU_SHARE, MPS limits
        kwargs: dict[str, Any] = {}
        if job.spec.user:
            user, _, group = job.spec.user.partition(":")
            kwargs["user"] = int(user) if user.isdigit() else user
            if group:
                kwargs["group"] = int(group) if group.isdigit() else group
        try:
            cwd = self._working_dir(job)
        except OSError as e:
            raise StartError(EXECUTOR_ERROR, f"cannot create the working dir: {e}") from e
        if job.spec.code:
            self._unpack_code(job, cwd)
        # the shell would export its working directory as PWD: so does a direct start
        env["PWD"] = str(cwd)
        proc = None
        for argv in _argvs(job, env, cwd):
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    **kwargs,
                )
                break
            except (OSError, ValueError, KeyError) as e:
                error = e
        if proc is None:
            raise StartError(EXECUTOR_ERROR, f"cannot start the process: {error}") from error
        pidfd = self._pidfds.open(proc.pid)  # before the stop thread (may reap it) knows it
        with self._lock:
            self._procs[job.id] = proc
        try:
            reader = None
            if pidfd is None:  # no pidfd to watch beside the pipe: a thread reads it
                reader = threading.Thread(
                    target=self._read, args=(job, ctl, proc), name=f"log-{job.id}", daemon=True
                )
                reader.start()
            stop = ctl.mark_started(
                job,
                pid=proc.pid,
                pid_start=process_start_ticks(proc.pid),
                ports=host_network_ports(job),
            )
            if stop is not None:
                threading.Thread(target=self.stop, args=(job, stop.timeout), daemon=True).start()
            code = proc.wait() if pidfd is None else self._watch(job, ctl, proc, pidfd)
            # The job is its main process: whatever it left in its group goes with it (and
            # lets go of the output pipe, which then ends).
            kill_group(proc.pid, signal.SIGKILL)
            if reader is not None:
                reader.join(timeout=DRAIN_SECONDS)
            else:
                self._drain(job, ctl, proc)
            return code if code >= 0 else 128 - code
        finally:
            self._pidfds.close(pidfd)
            with self._lock:
                self._procs.pop(job.id, None)

    def session_target(self, job: Job) -> dict[str, Any]:
        """A shell in the job's working dir as its user, with its env (but for secret values,
        which never go to disk)."""
        secret = set(job.spec.secret_env)
        env = {k: v for k, v in job.spec.env.items() if k not in secret and v != REDACTED}
        env.update(gpu_env(job.gpu_vendor, job.gpus))
        env.update(job.gpu_share_env)
        return {
            "runtime": RUNTIME_PROCESS,
            "user": job.spec.user,
            "working_dir": str(self._working_dir(job)),
            "env": env,
        }

    def _unpack_code(self, job: Job, cwd: Path) -> None:
        """Put the job's code archive in place: `wd/` in its working dir, `home/` in its
        user's home, `abs/` at `/` (as this agent's user, as the job itself would write)."""
        code = job.spec.code
        if self._blobs is None or code is None or not self._blobs.has(code):
            raise StartError(EXECUTOR_ERROR, f"the code archive {code} is not on this host")
        account = _account(job.spec.user)
        owner = None
        if account is not None and os.geteuid() == 0 and account.pw_uid != 0:
            owner = (account.pw_uid, account.pw_gid)  # the job's user can change its files
        home = Path(account.pw_dir) if account is not None else Path.home()
        try:
            cwd.mkdir(parents=True, exist_ok=True)
            count = unpack(self._blobs.path(code), {WD: cwd, HOME: home, ABS: Path("/")}, owner)
        except (UnpackError, OSError) as e:
            raise StartError(EXECUTOR_ERROR, f"cannot unpack the code into {cwd}: {e}") from e
        log.info("job %s: unpacked %d file(s) of code %s", job.id, count, code[:12])

    def _watch(self, job: Job, ctl: JobControl, proc: subprocess.Popen, pidfd: int) -> int:
        """The job's exit status, its output passed on meanwhile (the pipe closed if ended)."""
        assert proc.stdout is not None
        pipe_open = pump_until_exit(
            pidfd, proc.stdout.fileno(), lambda data: ctl.append_log(job, data)
        )
        if not pipe_open:
            proc.stdout.close()
        return proc.wait()

    def _drain(self, job: Job, ctl: JobControl, proc: subprocess.Popen) -> None:
        """What the job's group wrote before it went; a pipe still held open after
        DRAIN_SECONDS (by a process that left the group) goes on being read by a thread of
        its own, as a job without a pidfd has, so that process writes on unhindered."""
        assert proc.stdout is not None
        if proc.stdout.closed:
            return
        if drain(proc.stdout.fileno(), lambda data: ctl.append_log(job, data), DRAIN_SECONDS):
            proc.stdout.close()
        else:
            threading.Thread(
                target=self._read, args=(job, ctl, proc), name=f"log-{job.id}", daemon=True
            ).start()

    def _read(self, job: Job, ctl: JobControl, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        try:
            read_to_end(proc.stdout.fileno(), lambda data: ctl.append_log(job, data))
        finally:
            proc.stdout.close()

    def stop(self, job: Job, timeout: float) -> None:
        kill_group(job.pid, signal.SIGTERM)
        with self._lock:
            proc = self._procs.get(job.id)
        if proc is None:
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(job.pid, signal.SIGKILL)

    def kill(self, job: Job) -> None:
        kill_group(job.pid, signal.SIGKILL)

    def shutdown(self, job: Job) -> None:
        self.kill(job)

    def kill_orphan(self, job: Job) -> None:
        """After a restart: kill what is left of the job's process group.

        Linux does not reuse a pid while a process group of that id has members, so if the pid
        now names a process with another start time, our group is gone and nothing is killed.
        """
        if not job.pid:
            return
        ticks = process_start_ticks(job.pid)
        if ticks is None or ticks == job.pid_start:
            kill_group(job.pid, signal.SIGKILL)
