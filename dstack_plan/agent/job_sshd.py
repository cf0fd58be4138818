"""An SSH server for a job whose spec asks for one (`ssh: {public_key}`: dev environments).

The agent runs the host's own OpenSSH `sshd` for the job, listening on the host's 127.0.0.1
on a free port, so nothing but the host itself reaches it: a client comes in through the
host's SSH (`ProxyJump`), as every other connection the controller makes does. It has its own
host key, generated here (the client pins its public half, reported in the job's info); it
lets in the one public key the spec carries, as this agent's user, and nothing else (no
passwords, no other users, no remote forwards). Every login runs `ssh_session.py` (the
`ForceCommand`), which enters the job: `docker exec` into its container, or a shell in its
working dir as its user for a process job. The same server works for both runtimes, and needs
nothing inside the container.

The server's files live in the job's dir (`sshd/`); its pid (with its start time, so a reused
pid is never signalled) is kept in the job's record: a container job re-adopted after an agent
restart keeps its server, and the server goes, with every session it opened, when the job
ends.
"""

from __future__ import annotations

import json
import logging
import os
import pkgutil
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstack_plan.agent.proctree import descendants, is_running, process_start_ticks

log = logging.getLogger(__name__)

SSHD_PATHS = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
KEYGEN_PATHS = ("/usr/bin/ssh-keygen", "/usr/local/bin/ssh-keygen")
SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/sftp-server",
)
PRIVSEP_DIR = Path("/run/sshd")
"""Debian's privilege separation dir, which sshd started as root needs (a tmpfs: gone after
a reboot until the host's own sshd starts)."""
START_TIMEOUT = 10.0
"""Seconds for a new server to answer with its SSH banner."""
PORT_ATTEMPTS = 3
STOP_WAIT = 2.0
"""Seconds for a SIGKILLed server to be gone."""
DOCKER_ENV = (
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_TLS_VERIFY",
    "DOCKER_CERT_PATH",
)
"""How the agent reaches its engine; the docker CLI of a session must reach the same one."""


@dataclass(frozen=True)
class SSHServer:
    """A job's server as its record keeps it; `error` says why there is none."""

    port: int | None = None
    host_key: str | None = None
    """Its public host key, `<algorithm> <base64>` (what the client pins)."""
    user: str | None = None
    """The user to log in as (the one the server runs as)."""
    working_dir: str | None = None
    """Where sessions start (the container's working dir, or the process's)."""
    pid: int | None = None
    pid_start: int | None = None
    error: str | None = None

    def info(self) -> dict[str, Any]:
        """The API view: how to reach it (no pid)."""
        if self.error is not None:
            return {"error": self.error}
        return {
            "port": self.port,
            "host_key": self.host_key,
            "user": self.user,
            "working_dir": self.working_dir,
        }

    def record(self) -> dict[str, Any]:
        return {**self.info(), "pid": self.pid, "pid_start": self.pid_start}

    @classmethod
    def from_record(cls, raw: Any) -> SSHServer | None:
        if not isinstance(raw, dict):
            return None
        known = {k: raw.get(k) for k in cls.__dataclass_fields__}
        return cls(**known)


class SSHDError(Exception):
    """The server could not be started; the message says why (and goes to the job's info)."""


def find_program(paths: tuple[str, ...], name: str) -> str | None:
    """The first of `paths` that is executable, else `name` on the PATH (with the sbin dirs)."""
    for path in paths:
        if os.access(path, os.X_OK):
            return path
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(name, path=search)


def login_user() -> str:
    """The user this agent (and so each job's server) runs as: the only one a server that
    runs as someone else than root can let in."""
    return pwd.getpwuid(os.geteuid()).pw_name


def session_config(target: dict[str, Any], sftp_marker: str) -> dict[str, Any]:
    """SESSION.json for `ssh_session.py`: the runtime's `target` with the host programs a
    session needs."""
    config = dict(target)
    config["sftp_marker"] = sftp_marker
    if target.get("runtime") == "docker":
        config["docker"] = shutil.which("docker")
        config["docker_env"] = {k: os.environ[k] for k in DOCKER_ENV if k in os.environ}
    else:
        config["sftp_server"] = next((p for p in SFTP_SERVERS if os.access(p, os.X_OK)), None)
    return config


def _config_word(path: Path) -> str:
    """`path` as one word of sshd_config (quoted when it has spaces). A path sshd would read
    otherwise (quotes, `%` tokens, newlines) is refused rather than escaped."""
    text = str(path)
    if any(c in text for c in '"%\n\r\t\\'):
        raise SSHDError(f"the agent's data dir path {text!r} cannot be used in an sshd config")
    return f'"{text}"' if " " in text else text


def sshd_config(directory: Path, port: int, user: str) -> str:
    """The server's sshd_config: loopback only, public-key logins of `user` only, every
    session through the ForceCommand."""
    force = shlex.join(
        [sys.executable, str(directory / "session.py"), str(directory / "session.json")]
    )
    if "\n" in force or "%" in force:
        raise SSHDError(f"cannot name the session command in an sshd config: {force!r}")
    lines = [
        f"ListenAddress 127.0.0.1:{port}",
        f"HostKey {_config_word(directory / 'host_ed25519')}",
        "PidFile none",
        f"AuthorizedKeysFile {_config_word(directory / 'authorized_keys')}",
        f"AllowUsers {user}",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "PermitRootLogin prohibit-password",
        "PermitEmptyPasswords no",
        "PermitUserEnvironment no",
        "UsePAM no",
        # the files are the agent's own, 0600 in its 0700 data dir (which may sit under /tmp,
        # a path StrictModes refuses)
        "StrictModes no",
        "AllowTcpForwarding local",
        "AllowStreamLocalForwarding no",
        "GatewayPorts no",
        "PermitTunnel no",
        "X11Forwarding no",
        "PrintMotd no",
        "UseDNS no",
        "ClientAliveInterval 30",
        "ClientAliveCountMax 4",
        f"ForceCommand {force}",
        f"Subsystem sftp {_config_word(directory / 'sftp')}",
    ]
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def _session_script() -> bytes:
    """ssh_session.py's source, from the package (a directory or the agent's zipapp)."""
    data = pkgutil.get_data("dstack_plan.agent", "ssh_session.py")
    if data is None:
        raise SSHDError("the agent bundle has no ssh_session.py")
    return data


def _host_key(directory: Path) -> str:
    """Generate the server's ed25519 host key; its public half, `<algorithm> <base64>`."""
    keygen = find_program(KEYGEN_PATHS, "ssh-keygen")
    if keygen is None:
        raise SSHDError("ssh-keygen is not on this host (Debian: openssh-client)")
    key = directory / "host_ed25519"
    for path in (key, key.with_suffix(".pub")):
        path.unlink(missing_ok=True)
    made = subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", "dstack-plan-job", "-f", str(key)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if made.returncode != 0:
        raise SSHDError(f"ssh-keygen failed: {made.stderr.strip() or made.returncode}")
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def start_sshd(directory: Path, public_key: str, target: dict[str, Any]) -> SSHServer:
    """Start a server in `directory` letting `public_key` in, its sessions entering
    `target` (the runtime's `session_target`). Raises SSHDError saying why it cannot."""
    sshd = find_program(SSHD_PATHS, "sshd")
    if sshd is None:
        raise SSHDError("no sshd on this host: install OpenSSH's server (Debian: openssh-server)")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    host_key = _host_key(directory)
    _write(directory / "authorized_keys", public_key.strip() + "\n")
    _write(directory / "session.py", _session_script())
    marker = str(directory / "sftp")
    _write(directory / "session.json", json.dumps(session_config(target, marker)))
    if os.geteuid() == 0 and not PRIVSEP_DIR.exists():
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    user = login_user()
    error = ""
    for _ in range(PORT_ATTEMPTS):
        port = _free_port()
        config = directory / "sshd_config"
        _write(config, sshd_config(directory, port, user))
        with open(directory / "sshd.log", "ab") as out:
            proc = subprocess.Popen(
                [sshd, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives an agent restart, as the container does
                close_fds=True,
            )
        error = _wait_ready(proc, port, directory / "sshd.log")
        if not error:
            # reaped when it exits (stopped, or killed by hand), never left a zombie
            threading.Thread(target=proc.wait, name=f"sshd-{proc.pid}", daemon=True).start()
            return SSHServer(
                port=port,
                host_key=host_key,
                user=user,
                working_dir=target.get("working_dir"),
                pid=proc.pid,
                pid_start=process_start_ticks(proc.pid),
            )
        if "Address already in use" not in error:
            break
    raise SSHDError(f"sshd did not start: {error}")


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log_file: Path) -> str:
    """'' once the server on `port` says its banner; else why not (it exited, or the time
    ran out: then it is killed)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return _tail(log_file) or f"exited with code {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return ""
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    return f"no answer on 127.0.0.1:{port} within {START_TIMEOUT:g}s: {_tail(log_file)}"


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " / ".join(text.strip().splitlines()[-lines:])


def sshd_alive(server: SSHServer | None) -> bool:
    """Whether the server's process still runs (the same process: its start time matches)."""
    if server is None or not server.pid:
        return False
    return is_running(server.pid, server.pid_start)


def has_sessions(server: SSHServer | None) -> bool:
    """Whether someone is connected: the server runs a process per connection."""
    if not sshd_alive(server):
        return False
    assert server is not None and server.pid is not None
    return bool(descendants(server.pid))


def stop_sshd(server: SSHServer | None) -> None:
    """Stop the server and every session it opened (they are its descendants: each sits in a
    session of its own, so signalling its group would miss them)."""
    if not sshd_alive(server):
        return
    assert server is not None and server.pid is not None
    for pid in [server.pid, *descendants(server.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + STOP_WAIT
    while sshd_alive(server) and time.monotonic() < deadline:
        time.sleep(0.01)  # until its port is closed: a finished job's server is gone
    log.info("stopped the job sshd on 127.0.0.1:%s", server.port)
