"""Put a gateway's relay (`gateway_relay.py`) on an SSH host and start it, check it, stop it.

On the host everything lives in `~/.dstack-plan/gateways/<name>/`: the relay, its
`config.json`, the TLS certificate and key (0600), `relay.pid`, `relay.log`, and
`upstream.sock`, the end of the reverse tunnel the owner's watch opens
(`watch/gateway_tunnels.py`), `tunnels/` where the watches of projects the gateway is
exported to open theirs (`<project>.sock`), and `routes/`, their services' host names
claimed (`proxy/gateway_relay.py`).

    remote = await install_gateway(conn, "gw-host", setup)   # RemoteGateway
    await stop_gateway(conn, "gw-host", remote.directory)

Installing again replaces the relay (stop, upload, start): a gateway's settings are few and
its restart takes a fraction of a second.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from dstack_plan.errors import SSHError
from dstack_plan.providers.ssh.install import run_command
from dstack_plan.proxy.gateway_layout import (
    GATEWAYS_DIR,
    RELAY_NAME,
    ROUTES_DIR,
    SOCKET_NAME,
    TUNNELS_DIR,
)

START_WAIT = 10.0


@dataclass(frozen=True)
class GatewaySetup:
    """What the relay of one gateway is told."""

    name: str
    listen_host: str
    """The address it listens on (`0.0.0.0`: every address of the host)."""
    listen_port: int
    cert_pem: bytes | None = None
    """The TLS certificate chain (PEM); None serves plain HTTP (`certificate: null`)."""
    key_pem: bytes | None = None


@dataclass(frozen=True)
class RemoteGateway:
    """A relay running on its host."""

    directory: str
    """Its directory on the host (absolute)."""
    socket: str
    """The Unix socket the reverse tunnel listens on (absolute)."""
    pid: int


def _relay_source() -> bytes:
    return (Path(__file__).parent / RELAY_NAME).read_bytes()


async def _directory(sftp: asyncssh.SFTPClient, name: str) -> str:
    home = await sftp.realpath(".")
    return f"{home.rstrip('/')}/{GATEWAYS_DIR}/{name}"


async def install_gateway(
    conn: asyncssh.SSHClientConnection, host: str, setup: GatewaySetup
) -> RemoteGateway:
    """Upload and (re)start the relay of `setup` on `host`; SSHError naming the host and the
    step when one fails (a port in use, no python3, a certificate the host cannot load)."""
    try:
        async with conn.start_sftp_client() as sftp:
            directory = await _directory(sftp, setup.name)
            await sftp.makedirs(directory, exist_ok=True)
            await sftp.chmod(directory, 0o700)
            for sub in (ROUTES_DIR, TUNNELS_DIR):
                await sftp.makedirs(f"{directory}/{sub}", exist_ok=True)
            config: dict[str, object] = {
                "listen_host": setup.listen_host,
                "listen_port": setup.listen_port,
                "socket": f"{directory}/{SOCKET_NAME}",
                "routes": f"{directory}/{ROUTES_DIR}",
                "tunnels": f"{directory}/{TUNNELS_DIR}",
            }
            files = {RELAY_NAME: _relay_source()}
            if setup.cert_pem is not None and setup.key_pem is not None:
                files["cert.pem"] = setup.cert_pem
                files["key.pem"] = setup.key_pem
                config["cert"] = f"{directory}/cert.pem"
                config["key"] = f"{directory}/key.pem"
            files["config.json"] = json.dumps(config, indent=2).encode()
            for name, data in files.items():
                async with sftp.open(f"{directory}/{name}", "wb") as f:
                    await f.write(data)
                await sftp.chmod(f"{directory}/{name}", 0o600)
    except (asyncssh.Error, OSError) as e:
        raise SSHError(host, f"cannot upload gateway {setup.name!r} over SFTP: {e}") from e
    await stop_relay(conn, host, directory)
    d = shlex.quote(directory)
    script = (
        f"cd {d} && rm -f relay.ready relay.pid && "
        f"(setsid python3 {RELAY_NAME} config.json > relay.log 2>&1 < /dev/null &) && "
        f"i=0; while [ ! -e relay.ready ] && [ $i -lt {int(START_WAIT * 10)} ]; do "
        'if [ -e relay.pid ] && ! kill -0 "$(cat relay.pid)" 2>/dev/null; then break; fi; '
        "sleep 0.1; i=$((i+1)); done; "
        "if [ -e relay.ready ]; then cat relay.pid; else tail -5 relay.log >&2; exit 1; fi"
    )
    _, output = await run_command(conn, host, script, f"starting gateway {setup.name!r}")
    return RemoteGateway(directory, f"{directory}/{SOCKET_NAME}", int(output.strip() or 0))


async def relay_running(conn: asyncssh.SSHClientConnection, host: str, directory: str) -> bool:
    """Whether the relay in `directory` runs (its pid alive and running the relay)."""
    d = shlex.quote(directory)
    script = (
        f'p="$(cat {d}/relay.pid 2>/dev/null)"; [ -n "$p" ] && kill -0 "$p" 2>/dev/null && '
        f'tr "\\0" " " < /proc/$p/cmdline | grep -q {shlex.quote(RELAY_NAME)} && echo running'
    )
    status, output = await run_command(conn, host, script, "checking the gateway", ok=(0, 1, 2))
    return status == 0 and "running" in output


async def stop_relay(conn: asyncssh.SSHClientConnection, host: str, directory: str) -> None:
    """Stop the relay in `directory`, if it runs; its files stay."""
    if not await relay_running(conn, host, directory):
        return
    d = shlex.quote(directory)
    script = (
        f'p="$(cat {d}/relay.pid)"; kill "$p"; i=0; '
        'while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; '
        'kill -9 "$p" 2>/dev/null; true'
    )
    await run_command(conn, host, script, "stopping the gateway")


async def stop_gateway(conn: asyncssh.SSHClientConnection, host: str, directory: str) -> None:
    """Stop the relay and remove its directory (certificate and key included)."""
    await stop_relay(conn, host, directory)
    if f"/{GATEWAYS_DIR}/" not in directory:
        raise SSHError(host, f"refusing to remove {directory!r}: not a gateway's directory")
    await run_command(conn, host, f"rm -rf {shlex.quote(directory)}", "removing the gateway")
