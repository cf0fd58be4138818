"""The test network guard stops traffic to addresses outside loopback and the test hosts."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.infra.network_guard import StrayNetworkAccess


def test_a_numeric_address_outside_the_test_network_is_refused_without_a_packet() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        with pytest.raises(StrayNetworkAccess, match="203.0.113.9"):
            sock.connect(("203.0.113.9", 22))


def test_asyncio_connections_are_guarded_too() -> None:
    # asyncio connects to a numeric host without resolving it: the connect itself is guarded
    async def connect() -> None:
        await asyncio.open_connection("198.51.100.7", 22)

    with pytest.raises(StrayNetworkAccess, match="198.51.100.7"):
        asyncio.run(connect())


def test_loopback_stays_reachable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
