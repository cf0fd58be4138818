"""The fast YAML loader: libyaml's C parser with YAML 1.1 scalars minus base-60 numbers.

YAML 1.1 reads `8000:80` as the integer 480080 and `2:4` as 124; in a port or GPU spec that
is never what a user meant, so colon-separated digits stay strings (as in YAML 1.2).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class FastLoader(_Base):  # type: ignore[misc, valid-type]
    """Safe loader without sexagesimal (base 60) integers and floats."""


FastLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in _Base.yaml_implicit_resolvers.items()
}
FastLoader.add_implicit_resolver(
    _INT,
    re.compile(
        r"""^(?:[-+]?0b[0-1_]+
        |[-+]?0[0-7_]+
        |[-+]?(?:0|[1-9][0-9_]*)
        |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    list("-+0123456789"),
)
FastLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
        |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_resolved: dict[str, str] = {}


def _resolve(self: Any, kind: Any, value: Any, implicit: Any) -> str:
    # Configs repeat the same keys and values endlessly; resolve each plain scalar once.
    if kind is yaml.ScalarNode and implicit[0]:
        tag = _resolved.get(value)
        if tag is None:
            tag = _BaseResolve(self, kind, value, implicit)
            if len(_resolved) < 100_000:
                _resolved[value] = tag
        return tag
    return _BaseResolve(self, kind, value, implicit)


def _construct_document(self: Any, node: Any) -> Any:
    """Build plain dicts, lists and scalars directly; anything unusual takes the slow path."""
    try:
        return _build(self, node, {})
    except _Unusual:
        return _BaseConstructDocument(self, node)


class _Unusual(Exception):
    """A merge key, an odd tag or a recursive structure: let PyYAML handle the document."""


def _build(loader: Any, node: Any, memo: dict[int, Any]) -> Any:
    if id(node) in memo:
        return memo[id(node)]
    tag = node.tag
    if tag == _STR:
        return node.value
    if tag == _MAP:
        result: dict[Any, Any] = {}
        memo[id(node)] = result
        for key_node, value_node in node.value:
            if key_node.tag not in (_STR, _INT) or key_node.value == "<<":
                raise _Unusual
            key = _build(loader, key_node, memo)
            result[key] = _build(loader, value_node, memo)
        return result
    if tag == _SEQ:
        items: list[Any] = []
        memo[id(node)] = items
        items.extend(_build(loader, item, memo) for item in node.value)
        return items
    if isinstance(node, yaml.ScalarNode) and tag.startswith("tag:yaml.org,2002:"):
        return loader.construct_object(node, deep=True)
    raise _Unusual


_BaseResolve = _Base.resolve
_BaseConstructDocument = _Base.construct_document
FastLoader.resolve = _resolve
FastLoader.construct_document = _construct_document


def load_all(text: str) -> list[Any]:
    """Every document of `text`; raises yaml.YAMLError with a mark on bad syntax."""
    return list(yaml.load_all(text, Loader=FastLoader))
