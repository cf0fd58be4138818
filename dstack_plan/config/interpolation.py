"""`${{ namespace.name }}` references: parsed and checked at load time, resolved at apply time.

Specs keep the symbolic text, so state and plans never hold a resolved secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

_EXPR_RE = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GROUP_IP_RE = re.compile(r"^groups\[\d+\]\.nodes\[\d+\]\.IP_ADDRESS$")

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
    if "${{" not in text:
        return []
    refs = []
    for match in _EXPR_RE.finditer(text):
        refs.append(_parse_expression(match.group(1).strip()))
    if text.count("${{") != len(refs):
        raise ValueError("unterminated interpolation: '${{' without a matching '}}'")
    return refs


def _parse_expression(expr: str) -> Reference:
    if _GROUP_IP_RE.match(expr):
        return Reference("groups", expr[len("groups") :])
    namespace, dot, name = expr.partition(".")
    if not dot or not name:
        raise ValueError(f"invalid interpolation '${{{{ {expr} }}}}': expected namespace.name")
    if namespace not in NAMESPACES:
        known = ", ".join([*NAMESPACES, "groups"])
        raise ValueError(f"unknown interpolation namespace {namespace!r} (known: {known})")
    allowed = NAMESPACES[namespace]
    if allowed is None and not _IDENT_RE.match(name):
        raise ValueError(f"invalid name {name!r} in '${{{{ {expr} }}}}'")
    if allowed is not None and name not in allowed:
        known = ", ".join(sorted(allowed))
        raise ValueError(f"unknown name {name!r} in namespace {namespace!r} (known: {known})")
    return Reference(namespace, name)


def scan(data: Any, path: Path = ()) -> Iterator[tuple[Path, str]]:
    """Yield (path, message) for every malformed reference in a loaded YAML document."""
    if isinstance(data, str):
        if "${{" in data:
            try:
                parse_references(data)
            except ValueError as e:
                yield path, str(e)
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from scan(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from scan(value, (*path, index))


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
    if "${{" not in text:
        return text

    def substitute(match: re.Match[str]) -> str:
        ref = _parse_expression(match.group(1).strip())
        try:
            return values[ref.namespace][ref.name]
        except KeyError:
            raise KeyError(f"{ref.namespace}.{ref.name}") from None

    return _EXPR_RE.sub(substitute, text)
