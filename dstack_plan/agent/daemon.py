"""Running the agent: in the foreground (`serve`) or detached (`start`, `stop`, `status`).

A lock file held by the serving process for its whole life tells whether an agent runs on a
data dir; the kernel drops it when the process dies, even by SIGKILL, so it is never stale.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from dstack_plan.agent.app import AgentApp
from dstack_plan.agent.datadir import DataDir, write_json_atomic
from dstack_plan.agent.liveness import connection_info, is_running, read_pid, try_lock
from dstack_plan.agent.protocol import AGENT_VERSION
from dstack_plan.agent.server import LISTEN_HOST, AgentServer

log = logging.getLogger(__name__)


class DaemonError(Exception):
    """A daemon command failed; the message says why."""


OPEN_FILES_WANTED = 1 << 20
"""Open files the agent asks for. A job holds two or three (its log, a process job's output
pipe, a session's more), while a systemd service or an SSH login starts with a soft limit of
1,024 (the hard limit, often 524,288, is what it may take): a few hundred jobs on a host, and
the next failed to start."""


def raise_open_files_limit() -> int:
    """Raise this process's open-files limit as far as it may: the soft limit to
    OPEN_FILES_WANTED (within the kernel's `nr_open`), which as root may raise the hard limit
    too, else to the hard limit. The soft limit now; jobs started later inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with open("/proc/sys/fs/nr_open") as f:
            wanted = min(OPEN_FILES_WANTED, int(f.read()))
    except (OSError, ValueError):
        wanted = OPEN_FILES_WANTED
    if hard == resource.RLIM_INFINITY:
        attempts = [(wanted, hard)]
    else:  # (hard, hard) is as far as one who is not root goes
        attempts = [(wanted, max(wanted, hard)), (hard, hard)]
    for new_soft, new_hard in attempts:
        if new_soft <= soft:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, new_hard))
            return new_soft
        except (ValueError, OSError):
            continue
    return soft


def serve(data: DataDir, port: int, log_max_bytes: int) -> int:
    """Run the agent in this process until SIGTERM/SIGINT."""
    data.ensure()
    log.debug("open files: up to %d", raise_open_files_limit())
    lock_fd = try_lock(data.serve_lock)
    if lock_fd is None:
        raise DaemonError(f"another agent (pid {read_pid(data)}) already serves {data.root}")
    data.pid_file.write_text(f"{os.getpid()}\n")
    token = data.token()
    app = AgentApp(data, log_max_bytes)
    try:
        server = AgentServer(port, app, token)
    except OSError as e:
        raise DaemonError(f"cannot listen on {LISTEN_HOST}:{port}: {e.strerror or e}") from e
    app.start()
    bound = server.server_address[1]
    # Logged before the connection file appears: whoever waits for that file finds the line.
    log.info("agent %s serving %s on %s:%d", AGENT_VERSION, data.root, LISTEN_HOST, bound)
    write_json_atomic(
        data.connection_file,
        {
            "pid": os.getpid(),
            "host": LISTEN_HOST,
            "port": bound,
            "url": f"http://{LISTEN_HOST}:{bound}",
            "token_file": str(data.token_file),
            "data_dir": str(data.root),
            "version": AGENT_VERSION,
            "agent_id": app.agent_id,
            "started_at": app.started_at,
        },
        mode=0o644,
    )

    def on_signal(signum: int, frame: Any) -> None:
        log.info("signal %d: shutting down", signum)
        # shutdown() waits for serve_forever, which runs in this (the signalled) thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        app.jobs.shutdown()
        server.server_close()
        data.connection_file.unlink(missing_ok=True)
        data.pid_file.unlink(missing_ok=True)
        os.close(lock_fd)
    log.info("agent stopped")
    return 0


def self_command() -> list[str]:
    """How to run this agent again: the zipapp it came from, or `-m dstack_plan.agent`."""
    flags = ["-I"] if sys.flags.isolated else []
    loader = getattr(sys.modules[__package__ or "dstack_plan.agent"], "__loader__", None)
    archive = getattr(loader, "archive", None)
    if archive:
        return [sys.executable, *flags, archive]
    return [sys.executable, *flags, "-m", "dstack_plan.agent"]


def _healthy(info: dict[str, Any], token: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        info["url"] + "/health", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with opener.open(request, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def start(
    data: DataDir,
    port: int,
    log_max_bytes: int,
    wait: float,
    log_level: str = "info",
    log_format: str = "text",
) -> dict[str, Any]:
    """Start a detached agent, or find the running one; returns its connection info."""
    data.ensure()
    start_lock = os.open(data.start_lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(start_lock, fcntl.LOCK_EX)  # two `start`s at once start one agent
        info = connection_info(data, wait=wait if is_running(data) else 0)
        if info is not None:
            return {**info, "already_running": True}
        argv = [
            *self_command(),
            "serve",
            "--data-dir",
            str(data.root),
            "--port",
            str(port),
            "--log-max-bytes",
            str(log_max_bytes),
            "--log-level",
            log_level,
            "--log-format",
            log_format,
        ]
        with open(data.log_file, "ab") as log_file:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                close_fds=True,
                cwd="/",
            )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                # an agent started by a caller that died before it answered (a killed apply)
                # may take the serve lock first: ours then exits, and that one is the answer
                if is_running(data):
                    info = connection_info(data, wait=max(deadline - time.monotonic(), 0))
                    if info is not None:
                        return {**info, "already_running": True}
                raise DaemonError(
                    f"the agent exited with code {proc.returncode}:\n{_tail(data.log_file)}"
                )
            info = connection_info(data)
            if info is not None and info.get("pid") == proc.pid and _healthy(info, data.token()):
                return {**info, "already_running": False}
            time.sleep(0.05)
        raise DaemonError(f"the agent did not answer within {wait:g}s; see {data.log_file}")
    finally:
        os.close(start_lock)


def _tail(path: Any, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def stop(data: DataDir, timeout: float, pid: int | None = None) -> bool:
    """Stop the running agent (SIGTERM, then SIGCONT so that a stopped one gets it too, as
    systemd does; SIGKILL after `timeout`); False if none ran, or (given `pid`) when the agent
    running is another process than `pid`."""
    if not is_running(data):
        return False
    running = read_pid(data)
    if running is None:
        raise DaemonError(f"an agent holds {data.serve_lock} but {data.pid_file} is unreadable")
    if pid is not None and running != pid:
        return False  # it was replaced meanwhile (another command restarted it): keep that one
    _signal(running, signal.SIGTERM)
    _signal(running, signal.SIGCONT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _exited(data, running):
            return True
        time.sleep(0.05)
    _signal(running, signal.SIGKILL)
    while not _exited(data, running):
        time.sleep(0.05)
    return True


def _exited(data: DataDir, pid: int) -> bool:
    """The agent let go of its lock and its process is gone: the lock is released a moment
    before the interpreter exits, and a caller that removes the agent's files after a stop
    must not race that moment."""
    if is_running(data):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return True  # another user's process has the pid now: ours is long gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has exited
    except (OSError, IndexError):
        return True


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it exited meanwhile


def status(data: DataDir) -> dict[str, Any]:
    """{running, ...connection info} of the data dir's agent."""
    info = connection_info(data)
    if info is None:
        return {"running": is_running(data), "data_dir": str(data.root)}
    return {"running": True, **info}


def dumps(info: dict[str, Any]) -> str:
    """JSON for the command line."""
    return json.dumps(info, indent=2, sort_keys=True)
