"""The pure parts of the servers' guards: reading `Host:`, which bind addresses check it, and
the rate limit of protocol-error lines (on an injected clock) for the aiohttp servers and the
agent."""

from __future__ import annotations

import logging

import pytest

from dstack_plan.agent.ratelimit import RateLimited
from dstack_plan.clock import FakeClock
from dstack_plan.proxy.loopback import (
    LOOPBACK,
    allowed_hosts,
    host_allowed,
    host_name,
    is_loopback_bind,
)


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:3000", "127.0.0.1"),
        ("LOCALHOST", "localhost"),
        ("[::1]:3000", "::1"),
        ("[::1]", "::1"),
        ("evil.example:80", "evil.example"),
        ("::1", None),
        ("[::1", None),
        ("[::1]x", None),
        ("localhost:3000@evil.example", None),
        ("localhost:", "localhost"),
        ("", None),
    ],
)
def test_host_name(header: str, name: str | None) -> None:
    assert host_name(header) == name


def test_which_binds_check_host() -> None:
    for bind in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"):
        assert is_loopback_bind(bind), bind
    for bind in ("0.0.0.0", "::", "", "10.0.0.1", "example.com"):  # noqa: S104
        assert not is_loopback_bind(bind) and allowed_hosts(bind) is None, bind
    assert allowed_hosts("127.0.0.2") == LOOPBACK | {"127.0.0.2"}
    assert host_allowed("127.0.0.2:8080", allowed_hosts("127.0.0.2"))
    assert not host_allowed("127.0.0.2:8080", allowed_hosts("127.0.0.1"))
    assert host_allowed(None, LOOPBACK) and host_allowed("evil.example", None)


def test_one_line_per_interval_then_the_count_of_those_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    caplog.set_level(logging.DEBUG)
    limited = RateLimited(logging.getLogger("test.limited"), 60.0, clock.now)
    assert limited.warning("bad request from %s", "a")
    for _ in range(5):
        clock.advance(10.0)
        assert not limited.warning("bad request from %s", "b")
    assert limited.suppressed == 5
    clock.advance(10.0)  # 60 s after the first line
    assert limited.warning("bad request from %s", "c")
    assert not limited.warning("bad request from %s", "d")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "bad request from a",
        "bad request from c (5 more such since the last line, not logged)",
    ]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}
