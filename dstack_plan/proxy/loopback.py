"""The `Host:` rule of servers that listen on loopback (the UI and API of `dstack ui` /
`watch --ui`, watch's service proxy), against DNS rebinding.

A web page the user visits can point a name of its own at 127.0.0.1 and then read from a
server there as from its own origin: the browser sends `Host: evil.example:PORT`. So a
server bound to loopback answers only requests whose `Host` names loopback: `127.0.0.1`,
`localhost` or `[::1]` (or the bound address itself, such as `127.0.0.2`), with any port or
none. The port is not checked: a rebinding page cannot choose the host name the browser sends,
whatever the port, and an SSH forward (`ssh -L 8000:127.0.0.1:3000`) or a container's port
mapping legitimately changes it. A request without `Host` (HTTP/1.0 tools) is answered: a
browser always sends one. Others get `421 Misdirected Request` with a short plain message.
"""

from __future__ import annotations

import ipaddress

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
"""The loopback names: binding to one of them needs no token (`web.auth`)."""
MISDIRECTED = 421


def is_loopback_bind(host: str) -> bool:
    """Whether listening on `host` listens on loopback only (any of 127.0.0.0/8, ::1,
    `localhost`)."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The host of a `Host:` value without its port (`[::1]:3000` -> `::1`), lower-cased;
    None when it does not read as `NAME`, `NAME:PORT`, `[IPV6]` or `[IPV6]:PORT`."""
    value = header.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None if rest else ""
        if not sep or port is None:
            return None
    else:
        name, _, port = value.partition(":")
    if not name or (port and not port.isdigit()):
        return None
    return name


def allowed_hosts(bind_host: str) -> frozenset[str] | None:
    """The host names a server bound to `bind_host` answers; None (any) off loopback."""
    if not is_loopback_bind(bind_host):
        return None
    return LOOPBACK | {bind_host.strip("[]").lower()}


def host_allowed(header: str | None, allowed: frozenset[str] | None) -> bool:
    """Whether a request with this `Host:` value (None: none sent) may be answered."""
    if allowed is None or header is None:
        return True
    return host_name(header) in allowed


def refusal(header: str | None) -> str:
    """The 421's plain-text body."""
    shown = (header or "")[:100].encode("ascii", "replace").decode()
    return (
        f"misdirected request: this server on loopback answers only Host 127.0.0.1, "
        f"localhost or [::1], not {shown!r}\n"
    )
