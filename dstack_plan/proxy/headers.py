"""Which headers cross the proxy: hop-by-hop ones never do; `X-Forwarded-*` are added."""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict

# RFC 9110 section 7.6.1, plus the obsolete `Keep-Alive` and `Proxy-Connection`
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def end_to_end(headers: Iterable[tuple[str, str]], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """`headers` without hop-by-hop ones (and those named in `Connection`) or `drop`."""
    items = list(headers)
    named = {
        token.strip().lower()
        for name, value in items
        if name.lower() == "connection"
        for token in value.split(",")
    }
    skip = HOP_BY_HOP | named | {d.lower() for d in drop}
    return CIMultiDict((name, value) for name, value in items if name.lower() not in skip)


def request_headers(
    headers: Iterable[tuple[str, str]],
    *,
    client: str | None,
    scheme: str,
    host: str,
    strip_auth: bool,
) -> CIMultiDict[str]:
    """What a replica receives: the client's end-to-end headers, without `Host` (the
    replica's own is sent) nor, when the proxy checked it, `Authorization`; with
    `X-Forwarded-For` (the client appended), `-Proto` and `-Host`."""
    drop = ["host", "authorization"] if strip_auth else ["host"]
    out = end_to_end(headers, drop)
    forwarded_for = ", ".join(out.getall("X-Forwarded-For", []) + ([client] if client else []))
    out.popall("X-Forwarded-For", None)
    if forwarded_for:
        out["X-Forwarded-For"] = forwarded_for
    out["X-Forwarded-Proto"] = scheme
    out["X-Forwarded-Host"] = host
    return out
