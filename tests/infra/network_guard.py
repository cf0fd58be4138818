"""Make stray network access fail loudly: tests may only reach loopback and their own hosts.

Two doors are guarded: name resolution (`getaddrinfo`), and connecting a socket, because
asyncio (and so asyncssh) never resolves a numeric address such as `10.0.0.1`: it connects
to it directly.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

ALLOWED_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
ALLOWED_NETWORKS = [
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
    ipaddress.ip_network("10.200.0.0/24"),  # the namespace test hosts
    ipaddress.ip_network("10.213.0.0/16"),  # tests/infra/ssh_hosts.py: hosts on the bridge
    ipaddress.ip_network("10.214.0.0/16"),  # tests/infra/ssh_hosts.py: behind the jump host
    ipaddress.ip_network("10.215.0.0/16"),  # tests/infra/slurm_cluster.py: the Slurm hosts
    ipaddress.ip_network("0.0.0.0/32"),
]


class StrayNetworkAccess(RuntimeError):
    """Raised when code under test tries to resolve or reach a host outside the test network."""


_own_addresses: set[str] = set()


def own_addresses() -> set[str]:
    """This machine's own interface addresses: traffic to them never leaves the machine."""
    if not _own_addresses:
        from dstack_plan.agent.hostfacts import addresses

        _own_addresses.update(str(a["address"]) for a in addresses())
        _own_addresses.add("")  # keep the set non-empty once computed
    return _own_addresses


def is_allowed(host: Any) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode()
    host = str(host)
    if host in ALLOWED_NAMES or host == socket.gethostname():
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if any(address in net for net in ALLOWED_NETWORKS):
        return True
    return str(address) in own_addresses()


def guarded_getaddrinfo(real: Callable[..., Any]) -> Callable[..., Any]:
    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".invalid"):
            # RFC 6761: never resolves; answered here, as a resolver would, without a query,
            # so tests can check how code reports an unknown host
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if not is_allowed(host):
            raise StrayNetworkAccess(f"test tried to resolve {host!r}: only loopback is allowed")
        return real(host, *args, **kwargs)

    return getaddrinfo


def guarded_connect(real: Callable[..., Any]) -> Callable[..., Any]:
    """`socket.connect` / `connect_ex` that refuse an IP address outside the test network."""

    def connect(sock: socket.socket, address: Any) -> Any:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
            if not is_allowed(address[0]):
                raise StrayNetworkAccess(
                    f"test tried to connect to {address[0]!r}: only loopback and the test "
                    "hosts are allowed"
                )
        return real(sock, address)

    return connect
