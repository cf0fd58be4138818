"""`${{ namespace.name }}` references: parsed and checked at load time, resolved at apply time.

Specs keep the symbolic text, so state and plans never hold a resolved secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

_OPEN, _CLOSE = "${{", "}}"
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GROUP_IP_RE = re.compile(r"^groups\[(\d+)\]\.(nodes|replicas)\[(\d+)\]\.IP_ADDRESS$")
"""dstack's grammar: a task's `groups[i].nodes[j]`, a service's `groups[i].replicas[j]`."""

NAMESPACES: dict[str, frozenset[str] | None] = {
    "env": None,  # any identifier
    "secrets": None,
    "run": frozenset({"args", "name", "project_name"}),
    "dstack": frozenset({"job_num", "node_rank"}),
}


class Reference(NamedTuple):
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"${{{{ {self.namespace}.{self.name} }}}}"


Path = tuple[str | int, ...]


def parse_references(text: str) -> list[Reference]:
    """All references in `text`; ValueError for an unknown namespace or a malformed one."""
    if _OPEN not in text:
        return []
    refs = [_parse_expression(expr.strip()) for _, _, expr in _expressions(text)]
    if _openings(text) != len(refs):  # one inside another: `${{ a ${{ b }}`
        raise ValueError("unterminated interpolation: '${{' without a matching '}}'")
    return refs


def _openings(text: str) -> int:
    """How many `${{` open an expression: `$${{` is dstack's escape for a literal `${{`."""
    return text.count(_OPEN) - text.count("$" + _OPEN)


def _expressions(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, inner text) of each `${{ ... }}`, left to right; ValueError for a `${{`
    without `}}`. Linear: a regex would rescan the rest of the text from every `${{`.
    An escaped `$${{ ... }}` is no expression: it stays as written (dstack's rule)."""
    start = text.find(_OPEN)
    while start >= 0:
        if start > 0 and text[start - 1] == "$":
            start = text.find(_OPEN, start + len(_OPEN))
            continue
        close = text.find(_CLOSE, start + len(_OPEN))
        if close < 0:
            raise ValueError("unterminated interpolation: '${{' without a matching '}}'")
        yield start, close + len(_CLOSE), text[start + len(_OPEN) : close]
        start = text.find(_OPEN, close + len(_CLOSE))


def _parse_expression(expr: str) -> Reference:
    if _GROUP_IP_RE.fullmatch(expr):
        return Reference("groups", expr[len("groups") :])
    if expr.split(".")[0].split("[")[0] == "groups":
        raise ValueError(
            f"invalid reference '${{{{ {expr} }}}}': expected groups[N].nodes[M].IP_ADDRESS "
            "(tasks) or groups[N].replicas[M].IP_ADDRESS (services)"
        )
    namespace, dot, name = expr.partition(".")
    if not dot or not name:
        raise ValueError(f"invalid interpolation '${{{{ {expr} }}}}': expected namespace.name")
    if namespace not in NAMESPACES:
        known = ", ".join([*NAMESPACES, "groups"])
        raise ValueError(f"unknown interpolation namespace {namespace!r} (known: {known})")
    allowed = NAMESPACES[namespace]
    if allowed is None and not _IDENT_RE.fullmatch(name):
        raise ValueError(f"invalid name {name!r} in '${{{{ {expr} }}}}'")
    if allowed is not None and name not in allowed:
        # dstack's parser lets any name through, but nothing defines it: `dstack apply` (for
        # commands) or its server (env, volumes, a gateway's domain) fails on "missing vars"
        known = ", ".join(sorted(allowed))
        raise ValueError(
            f"unknown name {name!r} in namespace {namespace!r} (known: {known}); dstack "
            "refuses it too, when the configuration is applied"
        )
    return Reference(namespace, name)


def scan(data: Any, path: Path = (), seen: set[int] | None = None) -> Iterator[tuple[Path, str]]:
    """Yield (path, message) for every malformed reference in a loaded YAML document.

    A list or mapping that YAML aliases repeat is one object in several places: it is checked
    once, at its first path (its problems are reported at its anchor either way).
    """
    if isinstance(data, str):
        if _OPEN in data:
            try:
                parse_references(data)
            except ValueError as e:
                yield path, str(e)
        return
    if not isinstance(data, dict | list):
        return
    if seen is None:
        seen = set()
    if id(data) in seen:
        return
    seen.add(id(data))
    items = data.items() if isinstance(data, dict) else enumerate(data)
    for key, value in items:
        yield from scan(value, (*path, key), seen)


def referenced_secrets(data: Any) -> set[str]:
    """Names of the secrets a spec (as JSON data) refers to."""
    names: set[str] = set()
    _collect_secrets(data, names)
    return names


def _collect_secrets(data: Any, names: set[str]) -> None:
    if isinstance(data, str):
        if "${{" in data:
            names.update(r.name for r in parse_references(data) if r.namespace == "secrets")
    elif isinstance(data, dict):
        for value in data.values():
            _collect_secrets(value, names)
    elif isinstance(data, list | tuple):
        for value in data:
            _collect_secrets(value, names)


def resolve(text: str, values: Mapping[str, Mapping[str, str]]) -> str:
    """Substitute references with `values[namespace][name]`; KeyError names a missing one."""
    if _OPEN not in text:
        return text
    parts: list[str] = []
    done = 0
    try:
        for start, end, expr in _expressions(text):
            ref = _parse_expression(expr.strip())
            try:
                value = values[ref.namespace][ref.name]
            except KeyError:
                raise KeyError(f"{ref.namespace}.{ref.name}") from None
            parts.extend((text[done:start], value))
            done = end
    except ValueError as e:
        if not str(e).startswith("unterminated"):
            raise
        # Loading reports an unterminated `${{`; text that never was loaded keeps it as written.
    parts.append(text[done:])
    return "".join(parts)


class GroupAddress(NamedTuple):
    """A `${{ groups[group].<member>[slot].IP_ADDRESS }}` reference."""

    group: int
    member: str
    """`nodes` (the nodes of a task's group) or `replicas` (the replicas of a service's)."""
    slot: int

    @property
    def name(self) -> str:
        """Its name in the `groups` namespace (the key `resolve` looks up)."""
        return f"[{self.group}].{self.member}[{self.slot}].IP_ADDRESS"

    def __str__(self) -> str:
        return f"groups{self.name}"


def group_addresses(text: str) -> list[GroupAddress]:
    """The group address references in `text`; none for text with a malformed reference."""
    try:
        refs = parse_references(text)
    except ValueError:
        return []
    found = []
    for ref in refs:
        match = _GROUP_IP_RE.fullmatch("groups" + ref.name) if ref.namespace == "groups" else None
        if match:
            found.append(GroupAddress(int(match[1]), match[2], int(match[3])))
    return found


def group_values(member: str, addresses: list[list[str]]) -> dict[str, str]:
    """The `groups` namespace for `resolve`: `addresses[i][j]` is slot j of group i."""
    return {
        GroupAddress(group, member, slot).name: address
        for group, row in enumerate(addresses)
        for slot, address in enumerate(row)
    }
