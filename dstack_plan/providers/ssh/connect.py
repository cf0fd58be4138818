"""Connections to a fleet's hosts: concurrent, bounded, one per host, reused within a command.

    async with SSHPool(HostKeyPolicy(store)) as pool:
        results = await pool.connect_all(targets)   # name -> connection or SSHError
        conn = await pool.connect(target)           # the same connection again

Every error names the host and says what to do about it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import asyncssh

from dstack_plan.clock import Clock, SystemClock
from dstack_plan.config.identity_files import identity_path
from dstack_plan.errors import HostKeyChangedError, SSHError
from dstack_plan.providers.ssh.hostkeys import HostKeyPolicy
from dstack_plan.providers.ssh.models import SSHTarget

log = logging.getLogger(__name__)

KEEPALIVE_INTERVAL = 5.0
KEEPALIVE_COUNT_MAX = 3
"""A kept connection whose host stops answering is closed after about 15 s of silence (a
link that went down loses no packets "slowly": it loses all of them). A slow link still
answers keepalives. Without this a dead connection is kept forever and every request over it
hangs until its own timeout, one after another (dstack issue #2346's opposite failure)."""

Connection = asyncssh.SSHClientConnection


class _PinningClient(asyncssh.SSHClient):
    """Hands every host key to the policy (asyncssh is given no trusted keys of its own)."""

    def __init__(self, policy: HostKeyPolicy, name: str):
        self.policy = policy
        self.name = name
        self.error: HostKeyChangedError | None = None

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        try:
            self.policy.check(self.name, addr, port, key)
        except HostKeyChangedError as e:
            self.error = e
            return False
        return True


def _client_keys(target: SSHTarget) -> dict[str, Any]:
    """asyncssh's key options for the target, or an SSHError saying what is wrong."""
    if target.private_key is not None:
        try:
            return {"client_keys": [asyncssh.import_private_key(target.private_key)]}
        except asyncssh.KeyImportError as e:
            return _encrypted_or_bad(target, "the inline ssh_key.private", e)
    if target.identity_file is None:
        return {}  # asyncssh's defaults: the ssh-agent and ~/.ssh/id_*
    path = identity_path(target.identity_file)
    if not path.is_file():
        raise SSHError(
            target.name,
            f"identity_file {target.identity_file} does not exist: fix the path in the "
            "fleet's ssh_config or create the key (ssh-keygen)",
        )
    try:
        return {"client_keys": [asyncssh.read_private_key(str(path))]}
    except asyncssh.KeyImportError as e:
        return _encrypted_or_bad(target, f"identity_file {target.identity_file}", e)
    except OSError as e:
        raise SSHError(target.name, f"cannot read identity_file {path}: {e.strerror}") from e


def _encrypted_or_bad(target: SSHTarget, what: str, error: Exception) -> dict[str, Any]:
    if "passphrase" not in str(error).lower():
        raise SSHError(target.name, f"{what} is not a valid private key: {error}")
    agent = os.environ.get("SSH_AUTH_SOCK")
    if agent:
        # the agent holds the decrypted key (ssh-add); asyncssh offers the agent's keys
        return {"agent_path": agent}
    raise SSHError(
        target.name,
        f"{what} is protected by a passphrase and no ssh-agent is running (SSH_AUTH_SOCK is "
        "unset): start one and `ssh-add` the key, or use a key without a passphrase",
    )


def _describe(target: SSHTarget, error: BaseException, timeout: float) -> str:
    where = f"{target.hostname}:{target.port}"
    if isinstance(error, asyncssh.PermissionDenied):
        key = target.identity_file or ("the inline ssh_key" if target.private_key else "any key")
        return (
            f"{target.user}@{where} refused {key} (publickey authentication failed): add the "
            f"public key to ~{target.user}/.ssh/authorized_keys on the host, or fix `user`"
        )
    if isinstance(error, socket.gaierror):
        return (
            f"cannot resolve host name {target.hostname!r} ({error.strerror}): check `hostname` "
            "in the fleet's ssh_config"
        )
    if isinstance(error, ConnectionRefusedError):
        return f"connection to {where} refused: is sshd running and listening on that port?"
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return f"no SSH answer from {where} within {timeout:g}s: is the host up and the port open?"
    if isinstance(error, OSError) and error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{where} is unreachable ({error.strerror}): check the address and the network"
    if isinstance(error, asyncssh.ChannelOpenError):
        jump = target.proxy_jump.name if target.proxy_jump else "?"
        return f"the jump host {jump} cannot reach {where}: {error.reason}"
    if isinstance(error, OSError):
        return f"cannot connect to {where}: {error.strerror or error}"
    return f"SSH to {where} failed: {error}"


RECONNECT_BACKOFF = (0.0, 5.0, 10.0, 30.0, 60.0)
"""Seconds before a target whose connect failed is dialled again, by failures in a row: the
first retry is at once (a blip), then 5 s, 10 s, 30 s, and every minute."""


@dataclass(frozen=True)
class _Failure:
    attempts: int
    retry_at: float
    """The pool clock's time before which the target is not dialled again."""
    error: SSHError


class SSHPool:
    """One connection per host, opened on first use, closed when the `async with` ends."""

    def __init__(
        self,
        policy: HostKeyPolicy,
        *,
        concurrency: int = 32,
        connect_timeout: float = 10.0,
        clock: Clock | None = None,
    ):
        self.policy = policy
        self.clock = clock or SystemClock()
        self.connect_timeout = connect_timeout
        self._limit = asyncio.Semaphore(concurrency)
        # keyed by the whole target: the same address through another jump host or with
        # another key is another connection
        self._connections: dict[SSHTarget, Connection] = {}
        self._locks: dict[SSHTarget, asyncio.Lock] = {}
        self._failed: dict[SSHTarget, _Failure] = {}
        """Targets whose last connect failed: asked again only after a backoff."""

    async def __aenter__(self) -> SSHPool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection (targets first, then the jump hosts they go through)."""
        for conn in reversed(list(self._connections.values())):
            conn.close()
        for conn in self._connections.values():
            await conn.wait_closed()
        self._connections.clear()

    async def connect_all(self, targets: Iterable[SSHTarget]) -> dict[str, Connection | SSHError]:
        """Connect to every target concurrently; a host that fails does not stop the others."""
        targets = list(targets)

        async def one(target: SSHTarget) -> Connection | SSHError:
            try:
                return await self.connect(target)
            except SSHError as e:
                return e

        results = await asyncio.gather(*(one(t) for t in targets))
        return {t.name: r for t, r in zip(targets, results, strict=True)}

    async def connect(self, target: SSHTarget) -> Connection:
        """The target's connection, opened now unless this pool has it already."""
        lock = self._locks.setdefault(target, asyncio.Lock())
        async with lock:
            conn = self._connections.get(target)
            if conn is not None and not conn.is_closed():
                return conn
            failed = self._failed.get(target)
            if failed is not None and self.clock.now() < failed.retry_at:
                # a host that just failed is not dialled again on every request (a watch
                # tick would wait out connect_timeout each time): the same answer until then
                raise failed.error
            tunnel = None
            if target.proxy_jump is not None:
                try:
                    tunnel = await self.connect(target.proxy_jump)
                except SSHError as e:
                    raise SSHError(target.name, f"via jump host {e}") from e
            try:
                conn = await self._open(target, tunnel)
            except SSHError as e:
                attempts = 1 if failed is None else failed.attempts + 1
                wait = RECONNECT_BACKOFF[min(attempts, len(RECONNECT_BACKOFF)) - 1]
                self._failed[target] = _Failure(attempts, self.clock.now() + wait, e)
                raise
            self._failed.pop(target, None)
            self._connections[target] = conn
            return conn

    async def _open(self, target: SSHTarget, tunnel: Connection | None) -> Connection:
        options = _client_keys(target)
        client = _PinningClient(self.policy, target.name)
        async with self._limit:
            try:
                conn, _ = await asyncssh.create_connection(
                    lambda: client,
                    target.hostname,
                    target.port,
                    tunnel=tunnel,
                    username=target.user,
                    # no trusted keys: every host key goes to the policy (never unchecked)
                    known_hosts=([], [], []),
                    config=None,
                    connect_timeout=self.connect_timeout,
                    keepalive_interval=KEEPALIVE_INTERVAL,
                    keepalive_count_max=KEEPALIVE_COUNT_MAX,
                    **({"agent_path": None} if "client_keys" in options else {}),
                    **options,
                )
            except asyncssh.HostKeyNotVerifiable as e:
                if client.error is not None:
                    raise client.error from None
                raise SSHError(target.name, f"host key not accepted: {e}") from e
            except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
                raise SSHError(target.name, _describe(target, e, self.connect_timeout)) from e
        log.debug("connected to %s", target.name)
        return conn
