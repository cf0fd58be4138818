"""`dstack exec`: one command on every host of a project's SSH fleets, concurrently.

    hosts = select_hosts(load_project(directory), fleet=None, names=())
    report = await run_on_hosts(hosts, ["uname", "-a"], on_line=print_it)

The command's arguments are joined with `shlex.join`, so what reaches the remote shell is
exactly the argument list given: spaces and shell metacharacters arrive intact. A host that
cannot be reached fails alone, with the reason; the others run.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import asyncssh
from pydantic import BaseModel, ConfigDict

from dstack_plan.errors import DstackPlanError, SSHError
from dstack_plan.providers.names import HOST_FLEET_PROVIDERS
from dstack_plan.providers.ssh.connect import SSHPool
from dstack_plan.providers.ssh.hostkeys import HostKeyPolicy, MemoryHostKeyStore
from dstack_plan.providers.ssh.models import SSHTarget, targets_from_config

if TYPE_CHECKING:
    from dstack_plan.config.resource import Desired
    from dstack_plan.state.model import State

Stream = Literal["stdout", "stderr"]
OnLine = Callable[[str, Stream, str], None]
"""Called with (host name, stream, line without its newline) as each output line arrives."""


@dataclass(frozen=True)
class FleetHost:
    """One host to run on, and the fleet that declares it."""

    fleet: str
    target: SSHTarget

    @property
    def name(self) -> str:
        return self.target.name


class HostRun(BaseModel):
    """What the command did on one host (`--json` prints these)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    fleet: str
    ok: bool
    exit_code: int | None
    """The command's exit status; None when it never ran or ended by a signal."""
    stdout: str
    stderr: str
    duration_s: float
    """From the start of connecting to the end of the command."""
    error: str | None
    """Why the host failed (unreachable, a non-zero exit, a signal); None when ok."""


class ExecReport(BaseModel):
    """Every host's result, in the order the fleets declare the hosts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: tuple[str, ...]
    hosts: tuple[HostRun, ...]

    @property
    def failed(self) -> list[HostRun]:
        return [h for h in self.hosts if not h.ok]

    def summary(self) -> str:
        """`3 hosts: 2 ok, 1 failed (h3: connection refused)`."""
        total = len(self.hosts)
        failed = self.failed
        line = f"{total} host{'s' if total != 1 else ''}: {total - len(failed)} ok"
        line += f", {len(failed)} failed"
        if failed:
            line += " (" + "; ".join(f"{h.host}: {h.error}" for h in failed) + ")"
        return line


def ssh_fleets(desired: Desired) -> list[tuple[str, list[SSHTarget]]]:
    """(fleet name, its hosts) of every SSH fleet the project declares, in order."""
    fleets = []
    for resource in desired.of_kind("fleet"):
        config = getattr(resource.spec, "ssh_config", None)
        if config is not None:
            fleets.append((resource.name, targets_from_config(config)))
    return fleets


def pinned_keys(state: State) -> dict[str, str]:
    """Host name -> the host key state pinned for it, over every SSH fleet in `state`."""
    from dstack_plan.fleets.records import FleetRecord

    pins: dict[str, str] = {}
    for entry in state.resources.values():
        if entry.kind == "fleet" and entry.provider in HOST_FLEET_PROVIDERS:
            pins.update(FleetRecord.of(entry).pins())
    return pins


def select_hosts(
    desired: Desired, fleet: str | None = None, names: Sequence[str] = ()
) -> list[FleetHost]:
    """The hosts to run on: every SSH fleet's, or `fleet`'s; only `names` when given.

    A host is named as messages show it: its hostname, with `:PORT` when the port is not 22.
    Raises DstackPlanError for a fleet that is not declared or not an SSH fleet, for a host
    name no selected fleet lists, and when there is no SSH host at all.
    """
    fleets = ssh_fleets(desired)
    if fleet is not None:
        declared = desired.resources.get(f"fleet.{fleet}")
        if declared is None:
            known = ", ".join(name for name, _ in fleets) or "none"
            raise DstackPlanError(f"fleet.{fleet} is not declared (SSH fleets: {known})")
        fleets = [(name, targets) for name, targets in fleets if name == fleet]
        if not fleets:
            raise DstackPlanError(
                f"fleet.{fleet} ({declared.source}) is not an SSH fleet: exec runs on the "
                "hosts of fleets with ssh_config"
            )
    if not fleets:
        raise DstackPlanError("the project declares no SSH fleet (a fleet with ssh_config)")
    hosts: dict[str, FleetHost] = {}
    for name, targets in fleets:
        for target in targets:
            hosts.setdefault(target.name, FleetHost(name, target))  # a host in two fleets: once
    if not names:
        return list(hosts.values())
    unknown = [n for n in names if n not in hosts]
    if unknown:
        raise DstackPlanError(
            f"no host {', '.join(unknown)} in "
            f"{'fleet.' + fleet if fleet else 'the SSH fleets'} (hosts: {', '.join(hosts)})"
        )
    wanted = set(names)
    return [h for h in hosts.values() if h.name in wanted]


async def run_on_hosts(
    hosts: Sequence[FleetHost],
    command: Sequence[str],
    *,
    on_line: OnLine | None = None,
    parallelism: int = 32,
    policy: HostKeyPolicy | None = None,
    connect_timeout: float = 10.0,
) -> ExecReport:
    """Run `command` (an argument list) on every host, at most `parallelism` at a time.

    Host keys: checked by `policy` (the CLI gives it the pins of state); without one,
    `~/.ssh/known_hosts` when it lists the host, else the first key seen, for this run.
    """
    if not command:
        raise DstackPlanError("no command given: put it after `--` (dstack exec -- uname -a)")
    line = shlex.join(command)
    limit = asyncio.Semaphore(max(1, parallelism))
    policy = policy or HostKeyPolicy(MemoryHostKeyStore())
    async with SSHPool(policy, concurrency=parallelism, connect_timeout=connect_timeout) as pool:

        async def one(host: FleetHost) -> HostRun:
            async with limit:
                return await _run_one(pool, host, line, on_line)

        results = await asyncio.gather(*(one(h) for h in hosts))
    return ExecReport(command=tuple(command), hosts=tuple(results))


async def _run_one(pool: SSHPool, host: FleetHost, line: str, on_line: OnLine | None) -> HostRun:
    started = time.monotonic()
    out: list[str] = []
    err: list[str] = []

    def result(exit_code: int | None, error: str | None) -> HostRun:
        return HostRun(
            host=host.name,
            fleet=host.fleet,
            ok=error is None,
            exit_code=exit_code,
            stdout="".join(out),
            stderr="".join(err),
            duration_s=round(time.monotonic() - started, 3),
            error=error,
        )

    try:
        conn = await pool.connect(host.target)
        process = await conn.create_process(
            line, stdin=asyncssh.DEVNULL, encoding="utf-8", errors="replace"
        )
        await asyncio.gather(
            _pump(process.stdout, out, host.name, "stdout", on_line),
            _pump(process.stderr, err, host.name, "stderr", on_line),
        )
        finished = await process.wait(check=False)
    except SSHError as e:
        return result(None, e.detail)
    except (OSError, asyncssh.Error) as e:  # the connection broke while the command ran
        return result(None, f"the SSH session failed: {e}")
    if finished.exit_signal is not None:
        return result(None, f"killed by signal {finished.exit_signal[0]}")
    code = finished.exit_status
    return result(code, None if code == 0 else f"exit code {code}")


async def _pump(
    reader: asyncssh.SSHReader[str],
    into: list[str],
    host: str,
    stream: Stream,
    on_line: OnLine | None,
) -> None:
    async for chunk in reader:  # one line at a time, the last one maybe without a newline
        if not chunk:  # asyncssh's reader yields an empty chunk at EOF
            continue
        into.append(chunk)
        if on_line is not None:
            on_line(host, stream, chunk.rstrip("\n"))
