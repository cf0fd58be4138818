"""Put the agent on an SSH host and start it: upload over SFTP, start detached, read back how
to reach it.

On the host, everything lives in `<agent_dir>/hosts/<node name>/` (`agent_dir` is
`~/.dstack-plan` unless absolute): `agent.pyz` and the agent's data dir `data/`. The node name
(`uname -n`) keeps hosts apart when they share a home directory (NFS), as cluster nodes often do.

    remote = await install_agent(conn, "gpu-1", bundle)   # RemoteAgent: port, token, ...

The upload is skipped when the host already has the same build (same sha256); a running agent
of that build is reused. A new build replaces the old in place: stop the old agent, upload,
start (containers of running jobs keep running: the agent finds them again by label). The
agent is started detached, not as a systemd unit, so it does not survive a reboot: the next
command that needs it starts it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shlex
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import asyncssh
from pydantic import BaseModel, ConfigDict, SecretStr

from dstack_plan.agent.build import build_zipapp
from dstack_plan.agent.protocol import TOKEN_FILE
from dstack_plan.errors import SSHError

log = logging.getLogger(__name__)

DEFAULT_AGENT_DIR = ".dstack-plan"
BUNDLE_NAME = "agent.pyz"
START_WAIT = 20.0
COMMAND_TIMEOUT = 60.0
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # zip's epoch: the same sources give the same bytes
_SHA256 = "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"


@dataclass(frozen=True)
class AgentBundle:
    """The agent zipapp to install, and its sha256 (what says two builds are the same)."""

    path: Path
    sha256: str

    @classmethod
    def of(cls, path: Path) -> AgentBundle:
        """The bundle at `path` (already built)."""
        return cls(path, hashlib.sha256(path.read_bytes()).hexdigest())


def build_bundle(out: Path, *, include_docker: bool = True) -> AgentBundle:
    """Build the agent zipapp at `out` reproducibly: the same sources give the same bytes (no
    file times inside), so a host that has this build is recognised and not uploaded to."""
    with tempfile.TemporaryDirectory(prefix="dstack-agent-") as tmp:
        built = build_zipapp(Path(tmp) / BUNDLE_NAME, include_docker=include_docker)
        content = built.read_bytes()
        start = content.index(b"PK\x03\x04")  # after the `#!` line zipapp writes first
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(built) as source, open(out, "wb") as target:
            target.write(content[:start])
            with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
                for info in source.infolist():
                    member = zipfile.ZipInfo(info.filename, _FIXED_TIME)
                    member.external_attr = info.external_attr
                    member.compress_type = zipfile.ZIP_DEFLATED
                    archive.writestr(member, source.read(info))
    out.chmod(0o755)
    return AgentBundle.of(out)


class RemoteAgent(BaseModel):
    """How to reach the agent running on a host (through a tunnel to its 127.0.0.1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str
    directory: str
    """`<agent_dir>/hosts/<node name>` on the host."""
    port: int
    token: SecretStr
    pid: int
    version: str
    sha256: str
    uploaded: bool
    """This install uploaded the bundle (the host had another build, or none)."""
    already_running: bool
    """The agent was running already (this install started none)."""


@dataclass(frozen=True)
class _Location:
    directory: str
    sha256: str | None

    @property
    def bundle(self) -> str:
        return f"{self.directory}/{BUNDLE_NAME}"

    @property
    def data(self) -> str:
        return f"{self.directory}/data"

    def agent_command(self, *args: str) -> str:
        """`python3 -I agent.pyz ARGS --data-dir DATA`, quoted for the remote shell."""
        argv = ["python3", "-I", self.bundle, *args, "--data-dir", self.data]
        return " ".join(shlex.quote(a) for a in argv)

    def print_token(self) -> str:
        """A command printing an empty line, then the agent's token."""
        return f"echo && cat {shlex.quote(f'{self.data}/{TOKEN_FILE}')}"


def _base(agent_dir: str) -> str:
    """`agent_dir` as a shell word: relative ones are under the login user's home."""
    return (
        shlex.quote(agent_dir)
        if agent_dir.startswith("/")
        else f'"$HOME"/{shlex.quote(agent_dir)}'
    )


async def _run(
    conn: asyncssh.SSHClientConnection,
    host: str,
    command: str,
    doing: str,
    ok: tuple[int, ...] = (0,),
) -> tuple[int, str]:
    """Run `command`: its exit status (one of `ok`) and stdout; SSHError naming the host and
    the step otherwise."""
    try:
        done = await conn.run(command, timeout=COMMAND_TIMEOUT)
    except (asyncssh.Error, OSError, TimeoutError) as e:
        raise SSHError(host, f"{doing}: {e}") from e
    status = done.exit_status if done.exit_status is not None else -1
    if status not in ok:
        detail = str(done.stderr or done.stdout or "").strip().splitlines()[-5:]
        raise SSHError(
            host, f"{doing} failed (exit {status}): " + (" ".join(detail) or "no output")
        )
    return status, str(done.stdout or "")


async def _locate(conn: asyncssh.SSHClientConnection, host: str, agent_dir: str) -> _Location:
    script = (
        f'd={_base(agent_dir)}/hosts/"$(uname -n)"; echo "dir=$d"; '
        f'if [ -f "$d/{BUNDLE_NAME}" ]; then echo "sha=$(python3 -c {shlex.quote(_SHA256)} '
        f'"$d/{BUNDLE_NAME}")"; fi'
    )
    facts = dict(
        line.partition("=")[::2]
        for line in (await _run(conn, host, script, "looking for the agent"))[1].splitlines()
    )
    if not facts.get("dir", "").startswith("/"):
        raise SSHError(host, f"cannot tell where the agent goes: the shell said {facts!r}")
    return _Location(facts["dir"], facts.get("sha") or None)


async def _upload(
    conn: asyncssh.SSHClientConnection, host: str, bundle: AgentBundle, where: _Location
) -> None:
    # to a temporary name first, then renamed over the old one: never a half-written bundle
    partial = f"{where.directory}/.{BUNDLE_NAME}.{secrets.token_hex(4)}"
    try:
        async with conn.start_sftp_client() as sftp:
            await sftp.makedirs(where.directory, exist_ok=True)
            await sftp.put(str(bundle.path), partial)
            await sftp.chmod(partial, 0o755)
            await sftp.posix_rename(partial, where.bundle)
    except (asyncssh.Error, OSError) as e:
        raise SSHError(
            host,
            f"cannot upload the agent to {where.bundle} over SFTP: {e} (is the sftp subsystem "
            "enabled in sshd_config, and the directory writable?)",
        ) from e
    log.info("uploaded the agent to %s:%s", host, where.bundle)


async def install_agent(
    conn: asyncssh.SSHClientConnection,
    host: str,
    bundle: AgentBundle,
    *,
    agent_dir: str = DEFAULT_AGENT_DIR,
) -> RemoteAgent:
    """Make the agent of `bundle` run on the host and say how to reach it (see module doc).

    Safe to repeat: with the same build on the host and running, it uploads and starts
    nothing. Raises SSHError naming the host when a step fails.
    """
    where = await _locate(conn, host, agent_dir)
    uploaded = where.sha256 != bundle.sha256
    if uploaded:
        if where.sha256 is not None:  # another build: stop its agent before replacing it
            await _run(conn, host, where.agent_command("stop"), "stopping the old agent")
        await _upload(conn, host, bundle, where)
    start = where.agent_command("start", "--wait", f"{START_WAIT:g}")
    _, output = await _run(conn, host, f"{start} && {where.print_token()}", "starting the agent")
    return _remote(host, where, bundle.sha256, output, uploaded=uploaded)


async def find_agent(
    conn: asyncssh.SSHClientConnection, host: str, *, agent_dir: str = DEFAULT_AGENT_DIR
) -> RemoteAgent | None:
    """The agent running on the host, or None when none runs there (never starts one)."""
    where = await _locate(conn, host, agent_dir)
    if where.sha256 is None:
        return None
    status = where.agent_command("status")
    # `status` exits 3 when no agent runs (and then the token is not printed)
    code, output = await _run(
        conn, host, f"{status} && {where.print_token()}", "asking the agent", ok=(0, 3)
    )
    if code == 3:
        return None
    return _remote(host, where, where.sha256, output, uploaded=False)


def _remote(
    host: str, where: _Location, sha256: str, output: str, *, uploaded: bool
) -> RemoteAgent:
    """What `start`/`status` printed (JSON), then the token on the last line."""
    lines = output.strip().splitlines()
    try:
        info = json.loads("\n".join(lines[:-1]))
        return RemoteAgent(
            host=host,
            directory=where.directory,
            port=int(info["port"]),
            token=SecretStr(lines[-1].strip()),
            pid=int(info["pid"]),
            version=str(info["version"]),
            sha256=sha256,
            uploaded=uploaded,
            already_running=bool(info.get("already_running", True)),
        )
    except (ValueError, KeyError, IndexError) as e:
        raise SSHError(host, f"the agent said something unexpected: {e}") from e


async def stop_agent(
    conn: asyncssh.SSHClientConnection, host: str, *, agent_dir: str = DEFAULT_AGENT_DIR
) -> bool:
    """Stop the host's agent (jobs in containers keep running); False when none was there or
    running. Leaves every file where it is (job logs stay readable by the next agent)."""
    where = await _locate(conn, host, agent_dir)
    if where.sha256 is None:
        return False
    _, output = await _run(conn, host, where.agent_command("stop"), "stopping the agent")
    return output.strip() == "stopped"
