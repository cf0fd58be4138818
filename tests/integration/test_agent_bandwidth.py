"""Bandwidth probes between two real agent processes on this machine (127.0.0.1)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from dstack_plan.errors import AgentError


async def test_one_agent_sends_to_another_and_both_measure(agent_factory: Any) -> None:
    receiver = agent_factory("receiver").client()
    sender = agent_factory("sender").client()
    listener = await receiver.probe_listen("127.0.0.1", 64 * 1024**2)
    assert listener.address == "127.0.0.1" and not listener.bound_all  # not every address
    sent = await sender.probe_send(listener, "127.0.0.1", 0.3, 64 * 1024**2)
    got = await receiver.probe_result(listener.id, wait=10)
    assert got.status == "done" and got.error is None
    assert got.bytes == sent.bytes > 0
    assert sent.bytes <= 64 * 1024**2  # bounded bytes
    assert got.bytes_per_second is not None and got.bytes_per_second > 0
    assert sent.bytes_per_second is not None and sent.bytes_per_second > 0
    assert listener.token.get_secret_value() not in repr(listener)  # a secret


async def test_a_connection_without_the_token_is_turned_away(agent_factory: Any) -> None:
    receiver = agent_factory("receiver").client()
    sender = agent_factory("sender").client()
    listener = await receiver.probe_listen("127.0.0.1", 1024**2)
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as stranger:
        stranger.sendall(b"x" * 32)
        assert stranger.recv(16) == b""  # closed on us
    sent = await sender.probe_send(listener, "127.0.0.1", 0.1, 1024**2)
    got = await receiver.probe_result(listener.id, wait=10)
    assert got.status == "done" and got.bytes == sent.bytes
    # one-shot: the port is closed once the sender got in
    with pytest.raises(AgentError, match="cannot connect"):
        await sender.probe_send(listener, "127.0.0.1", 0.1, 1024**2)


async def test_an_address_not_of_this_host_listens_on_all_and_a_failed_send_is_clear(
    agent_factory: Any,
) -> None:
    agent = agent_factory().client()
    listener = await agent.probe_listen("192.0.2.1", 1024**2)  # TEST-NET-1: nobody's address
    assert listener.bound_all
    with pytest.raises(AgentError, match=r"cannot connect to 127\.0\.0\.1:1: "):
        await agent.probe_send(listener.model_copy(update={"port": 1}), "127.0.0.1", 0.1, 1024)
    with pytest.raises(AgentError, match="seconds: must be a number") as e:
        await agent.probe_send(listener, "127.0.0.1", 60, 1024)
    assert e.value.status == 400
