"""A Slurm cluster's login node: commands run there over one SSH connection.

Everything we ask Slurm goes through the login node, as a user at a terminal would: `sbatch`,
`squeue`, `scancel`, `sinfo`, `scontrol`, and plain `tar`, `cat`, `rm` in the work directory.
Its host key is pinned on first use like any SSH host's (`providers/ssh/hostkeys.py`), unless
`~/.ssh/known_hosts` knows it. Every failure is an SSHError naming the login node and the step.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import asyncssh

from dstack_plan.config.slurm_backend import SlurmCluster
from dstack_plan.errors import SSHError
from dstack_plan.providers.ssh.connect import Connection, SSHPool
from dstack_plan.providers.ssh.hostkeys import HostKeyPolicy
from dstack_plan.providers.ssh.models import SSHTarget
from dstack_plan.providers.ssh.pins import HostKeyStore

COMMAND_TIMEOUT = 60.0
"""Seconds one command on the login node may take (a busy slurmctld answers in seconds)."""


def login_target(cluster: SlurmCluster) -> SSHTarget:
    """How to log in to `cluster`'s login node."""
    jump = cluster.proxy_jump
    return SSHTarget(
        hostname=cluster.hostname,
        user=cluster.user,
        port=cluster.port,
        identity_file=cluster.identity_file,
        proxy_jump=(
            SSHTarget(jump.hostname, jump.user, jump.port, jump.identity_file)
            if jump is not None
            else None
        ),
    )


def shell_path(path: str) -> str:
    """`path` as a shell word: quoted, with a leading `~/` as the user's home (`$HOME`); a
    relative path stays relative (commands start in the home directory)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True)
class Ran:
    """What a command on the login node did."""

    status: int
    stdout: bytes
    stderr: str

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")


class LoginNode:
    """Runs commands on a cluster's login node; one connection, opened on first use."""

    def __init__(self, cluster: SlurmCluster, pins: HostKeyStore):
        self.cluster = cluster
        self.target = login_target(cluster)
        self.pins = pins
        """Where the login node's host key is pinned (first use adds it)."""
        self._pool = SSHPool(HostKeyPolicy(pins))

    @property
    def name(self) -> str:
        """How messages name the login node: `cluster (host)`."""
        return f"slurm cluster {self.cluster.name} ({self.target.name})"

    async def connection(self) -> Connection:
        return await self._pool.connect(self.target)

    async def run(
        self,
        command: str,
        doing: str,
        *,
        stdin: bytes | None = None,
        ok: tuple[int, ...] = (0,),
    ) -> Ran:
        """Run `command` (a shell line whose every user-given word is quoted), with `stdin`.
        SSHError saying what was being done when it cannot be
        run or exits with a status not in `ok` (with the last lines it printed)."""
        conn = await self.connection()
        try:
            done = await conn.run(
                command, input=stdin, encoding=None, timeout=COMMAND_TIMEOUT, check=False
            )
        except (asyncssh.Error, OSError, TimeoutError) as e:
            raise SSHError(self.name, f"{doing}: {e}") from e
        status = done.exit_status if done.exit_status is not None else -1
        stdout = done.stdout if isinstance(done.stdout, bytes) else b""
        ran = Ran(status, stdout, _text(done.stderr))
        if status not in ok:
            detail = (ran.stderr or ran.out).strip().splitlines()[-5:]
            raise SSHError(
                self.name, f"{doing} failed (exit {status}): " + (" ".join(detail) or "no output")
            )
        return ran

    async def close(self) -> None:
        await self._pool.close()


def _text(data: object) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return str(data or "")
