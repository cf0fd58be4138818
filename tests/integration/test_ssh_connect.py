"""The SSH connection layer against real sshd hosts in network namespaces."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from dstack_plan.errors import HostKeyChangedError, SSHError
from dstack_plan.providers.ssh.connect import SSHPool
from dstack_plan.providers.ssh.hostkeys import HostKeyPolicy, MemoryHostKeyStore, fingerprint
from dstack_plan.providers.ssh.models import SSHTarget
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh


def target(hosts: SSHTestHosts, name: str, **fields: object) -> SSHTarget:
    values: dict[str, object] = {
        "hostname": hosts[name].address,
        "user": "root",
        "identity_file": str(hosts.client_key),
    }
    values.update(fields)
    return SSHTarget(**values)  # type: ignore[arg-type]


def policy(tmp_path: Path, store: MemoryHostKeyStore | None = None) -> HostKeyPolicy:
    # an empty known_hosts: only the pins decide (root's own ~/.ssh stays out of the tests)
    return HostKeyPolicy(store or MemoryHostKeyStore(), known_hosts=tmp_path / "known_hosts")


def host_key_line(hosts: SSHTestHosts, name: str) -> str:
    return " ".join(Path(f"{hosts[name].host_key}.pub").read_text().split()[:2])


async def test_three_hosts_concurrently_one_connection_each(
    ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    targets = [target(ssh_hosts, n) for n in ("h1", "h2", "h3")]
    keys = policy(tmp_path)
    async with SSHPool(keys) as pool:
        results = await pool.connect_all(targets)
        names = {}
        for t in targets:
            conn = results[t.name]
            assert not isinstance(conn, SSHError), conn
            assert await pool.connect(t) is conn  # reused, not reopened
            names[t.name] = (await conn.run("hostname", check=True)).stdout
    assert names == {t.name: f"{n}\n" for t, n in zip(targets, ("h1", "h2", "h3"), strict=True)}
    # first use: each host's own key is pinned, to be recorded in state
    assert keys.pinned == {
        t.name: host_key_line(ssh_hosts, n)
        for t, n in zip(targets, ("h1", "h2", "h3"), strict=True)
    }


async def test_host_with_sshd_stopped_fails_alone(ssh_hosts: SSHTestHosts, tmp_path: Path) -> None:
    targets = [target(ssh_hosts, n) for n in ("h1", "h2", "h3")]
    ssh_hosts.stop("h3")
    try:
        async with SSHPool(policy(tmp_path)) as pool:
            results = await pool.connect_all(targets)
    finally:
        ssh_hosts.start("h3")
    error = results[ssh_hosts["h3"].address]
    assert isinstance(error, SSHError)
    assert str(error) == (
        f"{ssh_hosts['h3'].address}: connection to {ssh_hosts['h3'].address}:22 refused: "
        "is sshd running and listening on that port?"
    )
    assert not isinstance(results[ssh_hosts["h1"].address], SSHError)
    assert not isinstance(results[ssh_hosts["h2"].address], SSHError)


async def test_changed_host_key_is_refused_until_retrusted(
    ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    store = MemoryHostKeyStore()
    h2 = target(ssh_hosts, "h2")
    async with SSHPool(policy(tmp_path, store)) as pool:
        await pool.connect(h2)
    old = store.get(h2.name)
    assert old == host_key_line(ssh_hosts, "h2")

    ssh_hosts.new_host_key("h2")
    new = host_key_line(ssh_hosts, "h2")
    keys = policy(tmp_path, store)
    for _ in range(2):  # refused every time, not only once
        async with SSHPool(keys) as pool:
            with pytest.raises(HostKeyChangedError) as refused:
                await pool.connect(h2)
        message = str(refused.value)
        assert message.startswith(f"{h2.name}: WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!")
        assert fingerprint(old) in message and fingerprint(new) in message
        assert fingerprint(new).startswith("SHA256:")
        assert "dstack fleet trust" in message
        assert store.get(h2.name) == old

    keys.trust(h2.name)
    async with SSHPool(keys) as pool:
        conn = await pool.connect(h2)
        assert (await conn.run("hostname", check=True)).stdout == "h2\n"
    assert store.get(h2.name) == new


async def test_known_hosts_entries_are_honoured(ssh_hosts: SSHTestHosts, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    h1 = target(ssh_hosts, "h1")
    store = MemoryHostKeyStore({h1.name: host_key_line(ssh_hosts, "h1")})
    # known_hosts wins over a pin: it lists another key for the address
    known_hosts.write_text(f"{h1.hostname} {host_key_line(ssh_hosts, 'h2')}\n")
    async with SSHPool(HostKeyPolicy(store, known_hosts=known_hosts)) as pool:
        with pytest.raises(HostKeyChangedError, match=str(known_hosts)):
            await pool.connect(h1)

    known_hosts.write_text(f"{h1.hostname} {host_key_line(ssh_hosts, 'h1')}\n")
    keys = HostKeyPolicy(MemoryHostKeyStore(), known_hosts=known_hosts)
    async with SSHPool(keys) as pool:
        await pool.connect(h1)
    assert keys.pinned == {}  # known_hosts vouched for it: nothing to pin


async def test_proxy_jump_reaches_a_host_only_the_jump_host_can_reach(
    ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    jump = target(ssh_hosts, "jump")
    inner = target(ssh_hosts, "inner", proxy_jump=jump)
    direct = target(ssh_hosts, "inner")
    keys = policy(tmp_path)
    async with SSHPool(keys) as pool:
        conn = await pool.connect(inner)
        assert (await conn.run("hostname", check=True)).stdout == "inner\n"
        # the root namespace has no route to it: only the jump host gets there
        with pytest.raises(SSHError) as unreachable:
            await pool.connect(direct)
    address = ssh_hosts["inner"].address
    assert str(unreachable.value) == (
        f"{address}: {address}:22 is unreachable (No route to host): check the address "
        "and the network"
    )
    assert set(keys.pinned) == {jump.name, inner.name}  # both hosts' keys are checked


async def test_proxy_jump_that_cannot_reach_its_target(
    ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    jump = target(ssh_hosts, "jump")
    nowhere = target(ssh_hosts, "inner", port=2299, proxy_jump=jump)
    async with SSHPool(policy(tmp_path)) as pool:
        with pytest.raises(SSHError) as failed:
            await pool.connect(nowhere)
    address = ssh_hosts["inner"].address
    assert str(failed.value).startswith(
        f"{address}:2299: the jump host {jump.name} cannot reach {address}:2299: "
    )


async def test_bad_keys_and_names_fail_per_host(
    ssh_hosts: SSHTestHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    locked = tmp_path / "locked_ed25519"
    stranger = tmp_path / "stranger_ed25519"
    for key, passphrase in ((locked, "secret"), (stranger, "")):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(key)], check=True
        )
    targets = [
        target(ssh_hosts, "h1", identity_file=str(tmp_path / "missing_key")),
        target(ssh_hosts, "h2", identity_file=str(locked)),
        target(ssh_hosts, "h3", identity_file=str(stranger)),
        target(ssh_hosts, "h1", hostname="gpu-7.invalid"),
        target(
            ssh_hosts, "jump", identity_file=None, private_key=ssh_hosts.client_key.read_text()
        ),
    ]
    async with SSHPool(policy(tmp_path), connect_timeout=5) as pool:
        results = await pool.connect_all(targets)
    messages = [str(r) for r in results.values()]
    assert messages[0] == (
        f"{ssh_hosts['h1'].address}: identity_file {tmp_path}/missing_key does not exist: fix "
        "the path in the fleet's ssh_config or create the key (ssh-keygen)"
    )
    assert messages[1].startswith(
        f"{ssh_hosts['h2'].address}: identity_file {locked} is protected by a passphrase and "
        "no ssh-agent is running"
    )
    assert messages[2] == (
        f"{ssh_hosts['h3'].address}: root@{ssh_hosts['h3'].address}:22 refused {stranger} "
        "(publickey authentication failed): add the public key to ~root/.ssh/authorized_keys "
        "on the host, or fix `user`"
    )
    assert messages[3].startswith("gpu-7.invalid: cannot resolve host name 'gpu-7.invalid'")
    # the inline key (dstack's ssh_key.private) works, beside the failures
    assert not isinstance(list(results.values())[4], SSHError)


class SilentHosts:
    """Three "hosts" that accept TCP and never say a word, counting the connections open at
    once. With `hang_up_at`, all of them hang up once that many are open together."""

    def __init__(self, hang_up_at: int | None = None) -> None:
        self.hang_up_at = hang_up_at
        self.open = 0
        self.most_at_once = 0
        self.crowd = asyncio.Event()
        self.servers: list[asyncio.Server] = []

    async def __aenter__(self) -> list[SSHTarget]:
        for _ in range(3):
            self.servers.append(await asyncio.start_server(self._serve, "127.0.0.1", 0))
        return [
            SSHTarget("127.0.0.1", "root", s.sockets[0].getsockname()[1]) for s in self.servers
        ]

    async def __aexit__(self, *exc: object) -> None:
        for server in self.servers:
            server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.most_at_once = max(self.most_at_once, self.open)
        if self.hang_up_at is not None and self.open >= self.hang_up_at:
            self.crowd.set()
        try:
            hung_up = asyncio.ensure_future(self.crowd.wait())
            client_gone = asyncio.ensure_future(reader.read())  # b"" once the client closes
            await asyncio.wait({hung_up, client_gone}, return_when=asyncio.FIRST_COMPLETED)
            hung_up.cancel()
            client_gone.cancel()
        finally:
            self.open -= 1
            writer.close()


async def test_connects_concurrently_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dialling = {"now": 0, "most": 0}  # dials in progress: at once, and the most at once
    create_connection = asyncssh.create_connection

    async def dial(*args: Any, **kwargs: Any) -> Any:
        dialling["now"] += 1
        dialling["most"] = max(dialling["most"], dialling["now"])
        try:
            return await create_connection(*args, **kwargs)
        finally:
            dialling["now"] -= 1

    monkeypatch.setattr(asyncssh, "create_connection", dial)
    # side by side: all three are dialled at once (they hang up when all three are; a pool
    # dialling one at a time would instead wait out a connect timeout of a minute on each)
    crowd = SilentHosts(hang_up_at=3)
    async with crowd as targets:
        async with SSHPool(policy(tmp_path), concurrency=3, connect_timeout=60) as pool:
            results = await asyncio.wait_for(pool.connect_all(targets), 30)
    assert crowd.most_at_once == dialling["most"] == 3
    for t in targets:  # each ended on the hang-up, none on its timeout
        assert isinstance(results[t.name], SSHError), results
        assert "no SSH answer" not in str(results[t.name])
    # one at a time: never two dialled together, each waiting out its connect timeout
    dialling["most"] = 0
    async with SilentHosts() as targets:
        async with SSHPool(policy(tmp_path), concurrency=1, connect_timeout=0.2) as pool:
            results = await pool.connect_all(targets)
    assert dialling["most"] == 1
    for t in targets:
        assert str(results[t.name]) == (
            f"{t.name}: no SSH answer from {t.name} within 0.2s: is the host up and the port open?"
        )


async def test_a_jump_host_shared_under_a_bound_of_one(
    ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    jump = target(ssh_hosts, "jump")
    targets = [target(ssh_hosts, "inner", proxy_jump=jump), target(ssh_hosts, "h1"), jump]
    async with SSHPool(policy(tmp_path), concurrency=1) as pool:
        results = await asyncio.wait_for(pool.connect_all(targets), 60)
        assert results[jump.name] is await pool.connect(jump)  # one connection, also the tunnel
    assert not any(isinstance(r, SSHError) for r in results.values()), results


async def test_a_key_with_a_passphrase_held_by_an_agent(
    ssh_hosts: SSHTestHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked_ed25519"
    shutil.copy(ssh_hosts.client_key, locked)
    locked.chmod(0o600)
    subprocess.run(
        ["ssh-keygen", "-q", "-p", "-P", "", "-N", "secret", "-f", str(locked)], check=True
    )
    askpass = tmp_path / "askpass"
    askpass.write_text("#!/bin/sh\necho secret\n")
    askpass.chmod(0o755)
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock), "SSH_ASKPASS": str(askpass)}
        env["SSH_ASKPASS_REQUIRE"] = "force"
        for _ in range(6000):  # a safety net: ssh-agent makes it at once
            if sock.exists():
                break
            time.sleep(0.01)
        subprocess.run(["ssh-add", str(locked)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        async with SSHPool(policy(tmp_path)) as pool:
            conn = await pool.connect(target(ssh_hosts, "h1", identity_file=str(locked)))
            assert (await conn.run("hostname", check=True)).stdout == "h1\n"
    finally:
        agent.kill()
        agent.wait()
