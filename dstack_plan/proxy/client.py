"""The proxy's HTTP client to replicas: one pooled aiohttp session, and the HTTP probe."""

from __future__ import annotations

import aiohttp

from dstack_plan.proxy.health import ProbeCheck
from dstack_plan.proxy.model import ProbeSettings, Upstream


def upstream_session(
    max_connections: int, connect_timeout: float, read_timeout: float | None
) -> aiohttp.ClientSession:
    """A session for forwarding: no total timeout (streams may last for hours), a bound on
    connecting and on the silence between two chunks; bytes pass through as they are (no
    decompression, no headers of its own)."""
    connector = aiohttp.TCPConnector(
        limit=max_connections, limit_per_host=0, keepalive_timeout=30, ttl_dns_cache=None
    )
    timeout = aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=connect_timeout, sock_read=read_timeout
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def http_probe(session: aiohttp.ClientSession) -> ProbeCheck:
    """A probe check sending the probe's request with `session`."""

    async def check(upstream: Upstream, settings: ProbeSettings) -> bool:
        timeout = aiohttp.ClientTimeout(total=settings.timeout)
        async with session.request(
            settings.method,
            upstream.url + settings.path,
            headers=dict(settings.headers),
            data=settings.body,
            timeout=timeout,
            allow_redirects=False,
        ) as response:
            await response.read()
            return not settings.require_success or 200 <= response.status < 300

    return check
