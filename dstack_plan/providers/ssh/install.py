"""Put the agent on an SSH host and start it: upload over SFTP, start it (a systemd unit where
systemd runs, detached otherwise), read back how to reach it.

On the host, everything lives in `<agent_dir>/hosts/<node name>/` (`agent_dir` is
`~/.dstack-plan` unless absolute): `agent.pyz` and the agent's data dir `data/`. The node name
(`uname -n`) keeps hosts apart when they share a home directory (NFS), as cluster nodes often do.

    remote = await install_agent(conn, "gpu-1", bundle)   # RemoteAgent: port, token, ...

The upload is skipped when the host already has the same build (same sha256, recorded in
`agent.pyz.sha256` at upload); a running agent of that build is reused. A new build replaces
the old in place: stop the old agent, upload, start (containers of running jobs keep running:
the agent finds them again by label).

Reusing a running agent takes one remote command and no python on the host (`locate.py`): it
reads the recorded sha256, the agent's pid, connection and token files, and checks that the pid
is the agent's `serve` process on this data dir; where systemd runs, also that the unit file is
the one this install would write, and enabled. Only when something is missing or different
does the install go on (upload, `agent.pyz start`, the unit). The agent so found is the one
`agent.pyz start` would have found running and returned.

An agent found running (either way) is reused only if it answers `/health` through the tunnel
within `HEALTH_TIMEOUT` seconds (while it is younger than `START_WAIT`, what is left of the
wait a fresh start gives it: `health_wait`). One that does not (stopped, hung, or listening in
another network namespace, where the host's 127.0.0.1:port is not it) is stopped (SIGTERM and
SIGCONT, SIGKILL after `HUNG_STOP_TIMEOUT`; its unit stopped too) and started again as a new
build's is: containers of its jobs are re-adopted, its process jobs end `executor_error`. A
warning names the host and the pid (`RemoteAgent.replaced_pid`).

Where systemd runs, the agent runs as an enabled unit (`systemd.py`), so it comes back after a
reboot (`RemoteAgent.persistent`); a non-root user's unit needs lingering for that, which the
install turns on when it may. Elsewhere (or when the user's service manager does not answer)
the agent is started detached and does not survive a reboot: the next command that needs it
starts it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import asyncssh
from pydantic import BaseModel, ConfigDict, SecretStr

from dstack_plan.agent.api_models import HostClaim
from dstack_plan.agent.client import AgentClient, health_wait
from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.protocol import HUNG_STOP_TIMEOUT, TOKEN_FILE
from dstack_plan.errors import SSHError
from dstack_plan.providers.ssh import locate
from dstack_plan.providers.ssh.bundle import AgentBundle, build_bundle, cached_bundle
from dstack_plan.providers.ssh.claims import HostOwners, OtherAgent
from dstack_plan.providers.ssh.locate import BUNDLE_NAME, SHA256_NAME, Running, UnitFile
from dstack_plan.providers.ssh.systemd import AgentUnit, SystemdFacts
from dstack_plan.providers.ssh.tunnel import AGENT_ADDRESS, tunnel

__all__ = [
    "AgentBundle",
    "SHA256_NAME",
    "RemoteAgent",
    "build_bundle",
    "cached_bundle",
    "find_agent",
    "forget_claim",
    "install_agent",
    "read_owners",
    "stop_agent",
]

log = logging.getLogger(__name__)

DEFAULT_AGENT_DIR = ".dstack-plan"
START_WAIT = 20.0
COMMAND_TIMEOUT = 60.0


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
    persistent: bool = False
    """It runs as an enabled systemd unit, so it comes back after a reboot (False: started
    detached, or a user unit without lingering)."""
    started_at: float | None = None
    """When it started, by the host's clock (None: not known)."""
    replaced_pid: int | None = None
    """The pid of the agent that was running but did not answer, which this install stopped
    before starting this one (None: it found none such)."""


@dataclass(frozen=True)
class _Location:
    directory: str
    sha256: str | None
    systemd: SystemdFacts | None = None
    running: Running | None = None
    unit_file: UnitFile | None = None
    now: float | None = None
    """The host's time when it was located (None: it did not say)."""
    claims: tuple[HostClaim, ...] = ()
    """Who owns the host, as its data dir records it (`agent/claims.py`)."""

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

    def record_sha256(self, sha256: str) -> str:
        """A command writing the bundle's sha256 beside it (after an upload)."""
        sha_file = shlex.quote(f"{self.directory}/{SHA256_NAME}")
        partial = shlex.quote(f"{self.directory}/.{SHA256_NAME}.{secrets.token_hex(4)}")
        return f"printf '%s\\n' {sha256} >{partial} && mv -f {partial} {sha_file}"

    def start_detached(self) -> str:
        """Start the agent detached (or find it running), then print its token."""
        start = self.agent_command("start", "--wait", f"{START_WAIT:g}")
        return f"{start} && {self.print_token()}"

    def status(self) -> str:
        """Print the agent's status (exit 3: none runs), then its token."""
        return f"{self.agent_command('status')} && {self.print_token()}"

    def unit(self, host: str) -> AgentUnit | None:
        """The agent's systemd unit, when systemd runs on the host."""
        if self.systemd is None:
            return None
        args = ["-I", self.bundle, "start", "--wait", f"{START_WAIT:g}", "--data-dir", self.data]
        try:
            return AgentUnit.of(
                self.systemd,
                self.directory.rsplit("/", 1)[-1],
                args,
                str(DataDir(Path(self.data)).pid_file),
            )
        except ValueError as e:
            raise SSHError(host, f"cannot write the agent's systemd unit: {e}") from e


async def run_command(
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
    """Where the agent goes, which build is there, whether it runs (one command: `locate`)."""
    _, output = await run_command(conn, host, locate.script(agent_dir), "looking for the agent")
    said = locate.parse_facts(output)
    directory = said.get("dir", "")
    if not directory.startswith("/"):
        raise SSHError(host, f"cannot tell where the agent goes: the shell said {said!r}")
    return _Location(
        directory,
        said.get("sha") or None,
        SystemdFacts.parse(said),
        locate.running(f"{directory}/{BUNDLE_NAME}", f"{directory}/data", said),
        locate.unit_file(said),
        float(said["now"]) if said.get("now", "").isdigit() else None,
        tuple(_claims(said)),
    )


def _claims(said: dict[str, str]) -> list[HostClaim]:
    found = []
    for raw in locate.claims(said):
        try:
            found.append(HostClaim.model_validate(raw))
        except ValueError:
            continue  # hand-edited or from another version: claims nothing
    return found


async def read_owners(
    conn: asyncssh.SSHClientConnection, host: str, *, agent_dir: str = DEFAULT_AGENT_DIR
) -> HostOwners:
    """Who has the host: the claims the agent's data dir records and the other agents that
    serve it, in one command; nothing is installed or started, and no agent need run."""
    _, output = await run_command(
        conn, host, locate.owners_script(agent_dir), "looking for the host's owners"
    )
    claims = tuple(_claims(locate.parse_facts(output)))
    others = tuple(OtherAgent(*found) for found in locate.other_agents(output))
    return HostOwners(claims, others)


async def forget_claim(
    conn: asyncssh.SSHClientConnection,
    host: str,
    lineage: str,
    fleet: str,
    *,
    agent_dir: str = DEFAULT_AGENT_DIR,
) -> None:
    """Remove the claim of `lineage`'s `fleet` from the host's data dir while no agent runs
    there to ask (the claim is the host's only one: the file goes). Any other claim stays."""
    where = await _locate(conn, host, agent_dir)
    if not any((c.lineage, c.fleet) == (lineage, fleet) for c in where.claims):
        return
    path = shlex.quote(f"{where.data}/{locate.CLAIMS_NAME}")
    await run_command(
        conn,
        host,
        f"grep -qF {shlex.quote(lineage)} {path} && rm -f {path}; true",
        "releasing the claim",
    )


def _reuse(host: str, where: _Location, unit: AgentUnit | None) -> RemoteAgent | None:
    """The running agent, when nothing needs doing to reuse it (see module doc)."""
    running = where.running
    if running is None:
        return None
    persistent = False
    if unit is not None:
        found = where.unit_file
        expected = hashlib.sha256(f"{unit.text}\n".encode()).hexdigest()
        if found is None or found.path != unit.path or found.sha256 != expected:
            return None  # no unit, or another one: the start script writes it
        if not found.enabled or (unit.user and not unit.lingering):
            return None  # the start script enables it (and lingering)
        persistent = True
    return _found(host, where, running, persistent=persistent)


def _found(host: str, where: _Location, running: Running, *, persistent: bool) -> RemoteAgent:
    """The running agent `_locate` found, reused as it is."""
    return RemoteAgent(
        host=host,
        directory=where.directory,
        port=running.port,
        token=SecretStr(running.token),
        pid=running.pid,
        version=running.version,
        sha256=where.sha256 or "",
        uploaded=False,
        already_running=True,
        persistent=persistent,
        started_at=running.started_at,
    )


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
            # no sha256 file while it does not describe the bundle (the start writes it)
            try:
                await sftp.remove(f"{where.directory}/{SHA256_NAME}")
            except asyncssh.SFTPNoSuchFile:
                pass
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
    nothing, in one remote command and one `/health` request through the tunnel. An agent that
    was running but does not answer is stopped and started again (see module doc). Raises
    SSHError naming the host when a step fails.
    """
    where = await _locate(conn, host, agent_dir)
    unit = where.unit(host)
    remote = await _install(conn, host, bundle, where, unit)
    if not remote.already_running:
        return remote  # `agent.pyz start` saw it answer
    age = None
    if where.now is not None and remote.started_at is not None:
        age = where.now - remote.started_at
    wait = health_wait(age, START_WAIT)
    if await _answers(conn, host, remote, wait):
        return remote
    await _stop_hung(conn, host, where, unit, remote.pid)
    restarted = await _install(
        conn, host, bundle, replace(where, sha256=bundle.sha256, running=None), unit
    )
    log.warning(
        "%s: agent (pid %d) did not answer within %gs; restarted it",
        host,
        remote.pid,
        round(wait, 1),
    )
    return restarted.model_copy(update={"replaced_pid": remote.pid})


async def _answers(
    conn: asyncssh.SSHClientConnection, host: str, remote: RemoteAgent, wait: float
) -> bool:
    """Whether the agent answers `/health` through the tunnel within `wait` seconds."""

    async def connection() -> asyncssh.SSHClientConnection:
        return conn

    probe = AgentClient(
        f"http://{AGENT_ADDRESS}:{remote.port}",
        remote.token,
        host=host,
        connect=tunnel(connection, remote.port),
        timeout=wait,
        retries=0,
    )
    return await probe.answers(wait)


async def _stop_hung(
    conn: asyncssh.SSHClientConnection,
    host: str,
    where: _Location,
    unit: AgentUnit | None,
    pid: int,
) -> None:
    """Stop the agent `pid` that does not answer: SIGTERM and SIGCONT (it may be stopped),
    SIGKILL after HUNG_STOP_TIMEOUT; then, where it runs as a unit, stop the unit as a new
    build does (so systemd does not start it again meanwhile). Jobs in containers keep
    running; the next agent finds them again."""
    timeout = f"{HUNG_STOP_TIMEOUT:g}"
    script = where.agent_command("stop", "--timeout", timeout, "--pid", str(pid))
    if unit is not None:
        script = f"{script} && {unit.restart_stop_script(where.agent_command('stop'))}"
    await run_command(conn, host, script, f"stopping the agent (pid {pid}) that did not answer")


async def _install(
    conn: asyncssh.SSHClientConnection,
    host: str,
    bundle: AgentBundle,
    where: _Location,
    unit: AgentUnit | None,
) -> RemoteAgent:
    """The running agent as `where` found it (when it can be reused as it is), else the bundle
    uploaded if need be and the agent started (or found running by `agent.pyz start`)."""
    uploaded = where.sha256 != bundle.sha256
    if not uploaded:
        reused = _reuse(host, where, unit)
        if reused is not None:
            return reused
    if uploaded:
        if where.sha256 is not None:  # another build: stop its agent before replacing it
            stop = where.agent_command("stop")
            script = stop if unit is None else unit.restart_stop_script(stop)
            await run_command(conn, host, script, "stopping the old agent")
        await _upload(conn, host, bundle, where)
    if unit is None:
        script = where.start_detached()
    else:
        script = unit.start_script(
            detached=where.start_detached(),
            stop_detached=where.agent_command("stop"),
            status=where.status(),
        )
    if uploaded:
        # `|| exit`, not `&&`: the start script is a list of commands, not one
        script = f"{where.record_sha256(bundle.sha256)} || exit $?; {script}"
    _, output = await run_command(conn, host, script, "starting the agent")
    remote = _remote(host, where, bundle.sha256, output, uploaded=uploaded)
    if unit is not None and not remote.persistent:
        log.warning(
            "%s: the agent runs %s, so it will not survive a reboot", host, _why_not(output)
        )
    return remote


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _why_not(output: str) -> str:
    """Why a host with systemd got no persistent agent (from the start script's output)."""
    for line in output.splitlines():
        if line.startswith("systemd_error="):
            return f"detached (systemd did not answer: {line.partition('=')[2]})"
    return "as a user unit without lingering (`loginctl enable-linger` failed)"


async def find_agent(
    conn: asyncssh.SSHClientConnection, host: str, *, agent_dir: str = DEFAULT_AGENT_DIR
) -> RemoteAgent | None:
    """The agent running on the host, or None when none runs there (never starts one)."""
    where = await _locate(conn, host, agent_dir)
    if where.sha256 is None or where.running is None:
        return None
    unit = where.unit(host)
    persistent = False
    if unit is not None and where.unit_file is not None and where.unit_file.present:
        persistent = not unit.user or unit.lingering  # as `AgentUnit.persistent_check`
    return _found(host, where, where.running, persistent=persistent)


def _remote(
    host: str, where: _Location, sha256: str, output: str, *, uploaded: bool
) -> RemoteAgent:
    """What `start`/`status` printed (JSON), then the token on the last line; before the JSON,
    `key=value` lines of the systemd start script (`persistent`, `was_running`)."""
    lines = output.strip().splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("{")), 0)
    said = dict(line.partition("=")[::2] for line in lines[:first])
    try:
        info = json.loads("\n".join(lines[first:-1]))
        return RemoteAgent(
            host=host,
            directory=where.directory,
            port=int(info["port"]),
            token=SecretStr(lines[-1].strip()),
            pid=int(info["pid"]),
            version=str(info["version"]),
            sha256=sha256,
            uploaded=uploaded,
            already_running=(
                said["was_running"] == "1"
                if "was_running" in said
                else bool(info.get("already_running", True))
            ),
            persistent=said.get("persistent") == "1",
            started_at=_number(info.get("started_at")),
        )
    except (ValueError, KeyError, IndexError) as e:
        raise SSHError(host, f"the agent said something unexpected: {e}") from e


async def stop_agent(
    conn: asyncssh.SSHClientConnection, host: str, *, agent_dir: str = DEFAULT_AGENT_DIR
) -> bool:
    """Stop the host's agent (jobs in containers keep running); False when none was there or
    running. Disables and removes its systemd unit, if any; leaves every other file where it is
    (job logs stay readable by the next agent)."""
    where = await _locate(conn, host, agent_dir)
    if where.sha256 is None:
        return False
    unit = where.unit(host)
    stop = where.agent_command("stop")
    script = stop if unit is None else unit.stop_script(stop)
    _, output = await run_command(conn, host, script, "stopping the agent")
    return "stopped" in output.splitlines()
