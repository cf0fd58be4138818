"""`dstack attach` on a dev environment: an SSH entry that reaches its job, for `ssh <run>`
and an IDE (VS Code Remote-SSH, Cursor, Windsurf, Zed).

    access = await attach_dev_environment(project, run, state)
    print(access.ssh_command, access.ide_link)

The job runs its own sshd, which its agent started on the host's 127.0.0.1 (`agent/job_sshd.py`)
and which lets the project key in (`providers/project_key.py`; apply gave the job its public
half). The entry (`runs/ssh_config.py`) reaches it the way the fleet's own connections go:
`ProxyJump` through the host's SSH (and through the fleet's `proxy_jump` before that), as the
fleet's user with the fleet's key, every host key pinned: the host's as the fleet recorded it,
the job server's as its agent reported it. A job on this machine (the local fleet) is reached
directly. The entry goes when the run is deleted (`runs/dev_ssh.py`) or stopped (`forget`).
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from dstack_plan.errors import AgentError, DstackPlanError, ProviderError
from dstack_plan.runs.dev_ssh import DEV_KIND
from dstack_plan.runs.records import JobRecord, RunRecord
from dstack_plan.runs.ssh_config import (
    Entry,
    HostBlock,
    Section,
    config_dir,
    known_host,
    user_config,
    write_entry,
)

if TYPE_CHECKING:
    from dstack_plan.agent.api_models import SSHServerInfo
    from dstack_plan.agent.client import AgentClient
    from dstack_plan.project import Project
    from dstack_plan.providers.ssh.models import SSHTarget
    from dstack_plan.state.model import ResourceState, State

log = logging.getLogger(__name__)

SSH_WAIT = 30.0
"""Seconds to wait for a starting job's SSH server to be up (its container being created)."""
_POLL = 0.5
JUMP_PREFIX = "dstack-plan-jump-"
"""The `Host` alias of the host a run's job runs on: `dstack-plan-jump-<run>` (a jump host
of that host adds `-1`, its own `-2`...)."""
KEY_ALIAS_PREFIX = "dstack-plan-"
"""The job server's key is pinned as `dstack-plan-<run>` (every one listens on 127.0.0.1)."""
LOCAL_ADDRESS = "127.0.0.1"
VSCODE_LIKE = {"vscode": "vscode", "cursor": "cursor", "windsurf": "windsurf"}
"""`ide:` -> the URL scheme of an editor that opens `vscode-remote/ssh-remote+HOST/PATH`."""
IDE_NAMES = {"vscode": "VS Code", "cursor": "Cursor", "windsurf": "Windsurf", "zed": "Zed"}


@dataclass(frozen=True)
class DevAccess:
    """A dev environment's SSH entry, written."""

    address: str
    run: str
    job: str
    working_dir: str
    ide: str | None
    config: Path
    """The file the `Host <run>` entry is in."""
    included: bool
    """`~/.ssh/config` includes it (False: `$DSTACK_PLAN_SSH_CONFIG_DIR` moved it; `ssh -F`)."""

    @property
    def ssh_command(self) -> str:
        if self.included:
            return f"ssh {self.run}"
        return shlex.join(["ssh", "-F", str(self.config), self.run])

    @property
    def ide_name(self) -> str | None:
        return IDE_NAMES.get(self.ide or "")

    @property
    def ide_link(self) -> str | None:
        """What opens the job's working dir in the `ide:` editor (None without one)."""
        path = quote(self.working_dir if self.working_dir.startswith("/") else "/")
        scheme = VSCODE_LIKE.get(self.ide or "")
        if scheme is not None:
            return f"{scheme}://vscode-remote/ssh-remote+{self.run}{path}"
        if self.ide == "zed":
            return f"zed ssh://{self.run}{path}"
        return None


async def attach_dev_environments(
    project: Project,
    runs: Sequence[ResourceState],
    *,
    wait: float = SSH_WAIT,
    stop: asyncio.Event | None = None,
) -> list[DevAccess | DstackPlanError]:
    """The SSH entry of each dev environment among `runs` (other kinds are skipped), or why
    it could not be written; side by side."""
    devs = [r for r in runs if r.kind == DEV_KIND]
    if not devs:
        return []
    state = (await asyncio.to_thread(project.backend.read)).state

    async def one(run: ResourceState) -> DevAccess | DstackPlanError:
        try:
            return await attach_dev_environment(project, run, state, wait=wait, stop=stop)
        except DstackPlanError as e:
            return e

    return list(await asyncio.gather(*(one(r) for r in devs)))


async def attach_dev_environment(
    project: Project,
    run: ResourceState,
    state: State,
    *,
    wait: float = SSH_WAIT,
    stop: asyncio.Event | None = None,
) -> DevAccess:
    """Write the SSH entry of dev environment `run`'s job (waiting up to `wait` seconds for its
    server to start). Raises DstackPlanError when the job has no server to reach (it ended,
    it was started before jobs had one, or its host could not start one)."""
    from dstack_plan.config.runs import DevEnvironmentSpec
    from dstack_plan.inspect.activity import dev_jobs
    from dstack_plan.inspect.runs import FINISHED, job_agent, job_records
    from dstack_plan.plan.normalize import spec_from_normalized

    spec = spec_from_normalized(run.kind, run.spec)
    if not isinstance(spec, DevEnvironmentSpec):
        raise DstackPlanError(f"{run.address} is not a dev environment: nothing to SSH into")
    active = [j for j in job_records(run) if j.status not in FINISHED]
    if not active:
        raise DstackPlanError(
            f"{run.address} has no running job to connect to ({run.status}): see dstack ps"
        )
    job = active[0]
    agent = await job_agent(project, run, job, state)
    server = await _server(project, agent, run, job, wait, stop)
    record = RunRecord.of(run)
    deployment = record.deployment or str(project.deployment)
    directory = config_dir()
    entry = _entry(project, run, record.fleet, job, server, state, deployment, directory)
    live = {j.id for _, j in dev_jobs(state)}

    def stale(section: Section) -> bool:
        """This project's entries of jobs that are no longer active (stopped, destroyed)."""
        return section.deployment == deployment and section.job not in live

    include_into = user_config()
    config = write_entry(entry, directory, include_into=include_into, stale=stale)
    return DevAccess(
        address=run.address,
        run=run.name,
        job=job.id,
        working_dir=server.working_dir or "/",
        ide=spec.ide,
        config=config,
        included=include_into is not None,
    )


async def _server(
    project: Project,
    agent: AgentClient,
    run: ResourceState,
    job: JobRecord,
    wait: float,
    stop: asyncio.Event | None,
) -> SSHServerInfo:
    """The job's SSH server as its agent reports it, once it is up."""
    clock = project.clock
    deadline = clock.now() + wait
    while True:
        try:
            info = await agent.get_job(job.id)
        except AgentError as e:
            if e.status != 404:
                raise
            raise DstackPlanError(f"{run.address}: job {job.id} is gone from its host") from None
        if info.finished:
            raise DstackPlanError(f"{run.address}: job {job.id} has ended ({info.status.value})")
        if "ssh" not in info.spec:
            raise DstackPlanError(
                f"{run.address}: job {job.id} was started without an SSH server (by an older "
                f"version): start it again with `dstack apply --replace {run.address}`"
            )
        server = info.ssh
        if server is not None and server.error:
            raise DstackPlanError(
                f"{run.address}: the host {job.host} could not start the job's SSH server: "
                f"{server.error}"
            )
        if server is not None and server.port and server.host_key and server.user:
            return server
        if clock.now() >= deadline or (stop is not None and stop.is_set()):
            raise DstackPlanError(
                f"{run.address}: job {job.id} has no SSH server yet ({info.status.value}) "
                f"after {wait:g}s: try dstack attach again once it runs"
            )
        await clock.sleep(_POLL)


def _entry(
    project: Project,
    run: ResourceState,
    fleet: str,
    job: JobRecord,
    server: SSHServerInfo,
    state: State,
    deployment: str,
    directory: Path,
) -> Entry:
    """The run's `Host` blocks: the hosts on the way (none on this machine), then its own."""
    from dstack_plan.providers.project_key import project_key

    assert server.port is not None and server.host_key is not None and server.user is not None
    key_alias = f"{KEY_ALIAS_PREFIX}{run.name}"
    known = [known_host(key_alias, 22, server.host_key)]
    keys: dict[str, str] = {}
    blocks: list[HostBlock] = []
    jump: str | None = None
    if not project.machines.implicit.implicit_instances(fleet):
        chain, pins = _route(project, fleet, job.host, state)
        for depth, target in enumerate(reversed(chain)):  # the outermost jump host first
            hops = len(chain) - 1 - depth
            alias = f"{JUMP_PREFIX}{run.name}" + (f"-{hops}" if hops else "")
            identity: Path | None = None
            if target.private_key is not None:
                name = f"{run.name}-{hops}"
                keys[name] = target.private_key
                identity = directory / "keys" / name
            elif target.identity_file is not None:
                identity = Path(target.identity_file).expanduser().absolute()
            pin = pins(target.name)
            if pin is not None:
                known.append(known_host(target.hostname, target.port, pin))
            blocks.append(
                HostBlock(
                    alias=alias,
                    hostname=target.hostname,
                    port=target.port,
                    user=target.user,
                    identity_file=identity,
                    proxy_jump=jump,
                    pinned=pin is not None,
                )
            )
            jump = alias
    blocks.append(
        HostBlock(
            alias=run.name,
            hostname=LOCAL_ADDRESS,
            port=server.port,
            user=server.user,
            identity_file=project_key(project.directory).private_path,
            proxy_jump=jump,
            host_key_alias=key_alias,
            keepalive=True,
        )
    )
    return Entry(run.name, job.id, deployment, tuple(blocks), tuple(known), keys)


def _route(
    project: Project, fleet: str, host: str, state: State
) -> tuple[list[SSHTarget], Callable[[str], str | None]]:
    """The SSH targets from the job's host outwards (the host, its jump host...), and the
    host key each was pinned with, by host name: as the fleet recorded it, or (a jump host,
    whose key state does not keep) as this command's connection to it pinned it on first use.
    None: `~/.ssh/known_hosts` vouched for it, so nothing was pinned."""
    from dstack_plan.fleets.machines import ssh_config_of
    from dstack_plan.fleets.records import FleetRecord
    from dstack_plan.providers.ssh.models import targets_from_config

    entry = state.get(f"fleet.{fleet}")
    if entry is None:
        raise ProviderError("fleet", f"fleet {fleet!r} is not in state: apply it first")
    target = next((t for t in targets_from_config(ssh_config_of(entry)) if t.name == host), None)
    if target is None:
        raise ProviderError(entry.provider, f"fleet {fleet!r} has no host {host!r}", host)
    chain: list[SSHTarget] = []
    hop: SSHTarget | None = target
    while hop is not None:
        chain.append(hop)
        hop = hop.proxy_jump
    recorded = FleetRecord.of(entry).pins()
    seen = project.machines.kept_provider(entry).policy.store

    def pin(name: str) -> str | None:
        return recorded.get(name) or seen.get(name)

    return chain, pin
