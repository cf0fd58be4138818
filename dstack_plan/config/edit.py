"""Edit configuration files in place: add a host to an SSH fleet's `ssh_config.hosts`.

The file is read with ruamel.yaml's round-trip loader, which knows where every node of every
document is; the new entry is then inserted as text after the last host, in that list's own
indentation. Everything outside the inserted lines stays byte for byte as it was: comments,
blank lines, key order, quoting, other documents. A list written in flow style
(`hosts: [a, b]`) has no line to insert after: that document is re-emitted by ruamel's
round-trip dumper, which keeps its comments and key order.
"""

from __future__ import annotations

import io
import ipaddress
import json
import re
from typing import Any, NamedTuple

from dstack_plan.errors import DstackPlanError

_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_URL = re.compile(
    r"^ssh://(?:(?P<user>[^@/]*)@)?(?P<host>\[[^\]/]*\]|[^:/@\[\]]*)(?::(?P<port>\d+))?/?$"
)
_DOCUMENT_MARKER = re.compile(r"^(---|\.\.\.)(\s|$)")


class HostURL(NamedTuple):
    """`ssh://[user@]host[:port]`, parsed."""

    user: str | None
    hostname: str
    port: int | None


def parse_host_url(url: str) -> HostURL:
    """The user, host and port of `ssh://[user@]host[:port]`; DstackPlanError if malformed.

    IPv6 addresses go in brackets (`ssh://u@[fd00::1]:2222`). Host names and users are
    refused when they hold anything but letters, digits and `.-_`: they end up on command
    lines and in YAML.
    """
    expected = f"invalid host URL {url!r}: expected ssh://USER@HOST[:PORT]"
    match = _URL.fullmatch(url)
    if match is None:
        raise DstackPlanError(expected)
    user, host, port_text = match.group("user", "host", "port")
    if user is not None and not _USER.fullmatch(user):
        raise DstackPlanError(f"{expected} (bad user name {user!r})")
    if host.startswith("["):
        hostname = host[1:-1]
        try:
            ipaddress.IPv6Address(hostname)
        except ValueError:
            raise DstackPlanError(f"{expected} (bad IPv6 address {hostname!r})") from None
    elif _HOSTNAME.fullmatch(host):
        hostname = host
    else:
        raise DstackPlanError(f"{expected} (bad host name {host!r})")
    port = None if port_text is None else int(port_text)
    if port is not None and not 1 <= port <= 65535:
        raise DstackPlanError(f"{expected} (the port must be from 1 to 65535, got {port})")
    return HostURL(user, hostname, port)


def add_ssh_host(text: str, document: int, entry: dict[str, Any]) -> str:
    """`text` with `entry` (a host: `{hostname, port?, user?, identity_file?}`) appended to
    the `ssh_config.hosts` list of its `document`-th YAML document (0-based).

    An entry of only a hostname is written in the short form (`- HOST`), as dstack's docs
    write hosts; any other as a mapping, `hostname` first.
    """
    from ruamel.yaml import YAML  # noqa: PLC0415 - only this command edits files

    documents = list(YAML(typ="rt").load_all(text))
    if not 0 <= document < len(documents):
        raise DstackPlanError(f"the file has no document {document + 1}")
    ssh, hosts = _hosts_list(documents[document])
    lines = text.splitlines(keepends=True)
    if hosts.fa.flow_style() or not hosts:  # `hosts: []` reads as block style, yet is flow
        line, col = ssh.lc.value("hosts")
        inserted = _into_flow_list(lines[line], col, entry, bool(hosts))
        if inserted is None:  # a list spread over several lines: let ruamel write it
            hosts.append(entry["hostname"] if list(entry) == ["hostname"] else _mapping(entry))
            return _dump(documents)
        lines[line] = inserted
        return "".join(lines)
    first_line, first_col = hosts.lc.item(0)
    dash = _dash_column(lines[first_line], first_col)
    last_line, _ = hosts.lc.item(len(hosts) - 1)
    after = _item_end(lines, last_line, dash)
    new = _entry_lines(entry, " " * dash, first_col - dash)
    if after > 0 and not lines[after - 1].endswith("\n"):  # the host was the file's last line
        lines[after - 1] += "\n"
    return "".join(lines[:after] + new + lines[after:])


def _hosts_list(data: Any) -> tuple[Any, Any]:
    ssh = data.get("ssh_config") if isinstance(data, dict) else None
    hosts = ssh.get("hosts") if isinstance(ssh, dict) else None
    if not isinstance(hosts, list):
        raise DstackPlanError("the fleet has no ssh_config.hosts list to add a host to")
    return ssh, hosts


def _into_flow_list(line: str, col: int, entry: dict[str, Any], nonempty: bool) -> str | None:
    """`line` with `entry` added before the `]` closing the flow list opened at `col`, or None
    when the list does not close on this line."""
    close = _closing_bracket(line, col)
    if close is None:
        return None
    if list(entry) == ["hostname"]:
        item = _scalar(entry["hostname"])
    else:
        item = "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in entry.items()) + "}"
    body = line[:close].rstrip(" ")
    lead = ", " if nonempty else ""
    return f"{body}{lead}{item}{line[close:]}"


def _closing_bracket(line: str, col: int) -> int | None:
    depth = 0
    quote = ""
    for index in range(col, len(line)):
        char = line[index]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return index if char == "]" else None
        elif char == "#" and line[index - 1] == " ":
            return None
    return None


def _dash_column(line: str, item_col: int) -> int:
    """The column of the `-` that starts the list item whose value starts at `item_col`."""
    col = item_col - 1
    while col >= 0 and line[col] == " ":
        col -= 1
    return col if col >= 0 and line[col] == "-" else max(item_col - 2, 0)


def _item_end(lines: list[str], start: int, dash: int) -> int:
    """The index of the line after the last content line of the item starting at `start`.

    A line belongs to the item while it is indented deeper than the item's `-`; blank lines
    and comments after its last content line stay after the inserted entry.
    """
    end = start + 1
    for index in range(start + 1, len(lines)):
        line = lines[index]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent <= dash or _DOCUMENT_MARKER.match(line):
            break
        end = index + 1
    return end


def _entry_lines(entry: dict[str, Any], indent: str, offset: int) -> list[str]:
    gap = " " * max(offset - 1, 1)
    if list(entry) == ["hostname"]:
        return [f"{indent}-{gap}{_scalar(entry['hostname'])}\n"]
    inner = indent + " " * max(offset, 2)
    lines = []
    for index, (key, value) in enumerate(entry.items()):
        lead = f"{indent}-{gap}" if index == 0 else inner
        lines.append(f"{lead}{key}: {_scalar(value)}\n")
    return lines


def _scalar(value: Any) -> str:
    """`value` as a YAML scalar: plain when it reads back as itself, else double-quoted."""
    from ruamel.yaml import YAML  # noqa: PLC0415

    if isinstance(value, int):
        return str(value)
    text = str(value)
    try:
        plain_reads_back = YAML(typ="safe").load(f"k: {text}\n") == {"k": text}
    except Exception:  # noqa: BLE001 - any parse failure means: quote it
        plain_reads_back = False
    return text if plain_reads_back else json.dumps(text)


def _mapping(entry: dict[str, Any]) -> Any:
    from ruamel.yaml.comments import CommentedMap  # noqa: PLC0415

    return CommentedMap(entry)


def _dump(documents: list[Any]) -> str:
    from ruamel.yaml import YAML  # noqa: PLC0415

    yaml = YAML(typ="rt")
    yaml.explicit_start = len(documents) > 1
    out = io.StringIO()
    yaml.dump_all(documents, out)
    return out.getvalue()
