"""The fast YAML loader: libyaml's C parser with YAML 1.1 scalars minus base-60 numbers.

YAML 1.1 reads `8000:80` as the integer 480080 and `2:4` as 124; in a port or GPU spec that
is never what a user meant, so colon-separated digits stay strings (as in YAML 1.2).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from dstack_plan.config.yaml_limits import (
    MAX_DEPTH,
    MAX_ISSUES,
    TOO_DEEP,
    DuplicateKeyError,
    LimitError,
    check_expansion,
    shorten,
)

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
C_LOADER = _Base is not yaml.SafeLoader
"""Whether libyaml does the parsing (its reader errors count bytes, not characters)."""
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class FastLoader(_Base):
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
    self.aliased = False
    self.first_lines = {}  # node ids are only unique while their document is alive
    reported = len(self.duplicates)
    try:
        data = _build(self, node, {}, 1)
    except _Unusual:
        del self.duplicates[reported:]  # the slow path finds them again
    else:
        if self.aliased:
            check_expansion(node)
        return data
    # Merge keys expand (and PyYAML's copy them) before anything else can look.
    check_expansion(node)
    self.flattened = set()
    return _BaseConstructDocument(self, node)


class _Unusual(Exception):
    """A merge key, an odd tag or a recursive structure: let PyYAML handle the document."""


def _build(loader: Any, node: Any, memo: dict[int, Any], depth: int) -> Any:
    if id(node) in memo:
        loader.aliased = True  # checked once the document is built; until then it is shared
        return memo[id(node)]
    tag = node.tag
    if tag == _STR:
        value = node.value
        if value.__class__ is str:
            return value
        raise _Unusual  # `!!str [1]`
    if tag == _MAP:
        if not isinstance(node, yaml.MappingNode):
            raise _Unusual
        if depth > MAX_DEPTH:
            raise LimitError(TOO_DEEP, node.start_mark)
        result: dict[Any, Any] = {}
        memo[id(node)] = result
        for key_node, value_node in node.value:
            if key_node.tag == _STR and key_node.value.__class__ is str:
                key = key_node.value
                if key == "<<":
                    raise _Unusual
            elif key_node.tag == _INT and isinstance(key_node, yaml.ScalarNode):
                key = loader.construct_object(key_node)
            else:
                raise _Unusual
            if key in result:  # reported, and the document still checked (the last one wins)
                _duplicate(loader, node, key, key_node)
            result[key] = _build(loader, value_node, memo, depth + 1)
        return result
    if tag == _SEQ:
        if not isinstance(node, yaml.SequenceNode):
            raise _Unusual
        if depth > MAX_DEPTH:
            raise LimitError(TOO_DEEP, node.start_mark)
        items: list[Any] = []
        memo[id(node)] = items
        for item in node.value:  # a loop, not a generator: one frame per level of nesting
            items.append(_build(loader, item, memo, depth + 1))
        return items
    if isinstance(node, yaml.ScalarNode) and tag.startswith("tag:yaml.org,2002:"):
        return loader.construct_object(node, deep=True)
    raise _Unusual


def _duplicate(loader: Any, node: Any, key: Any, key_node: Any) -> None:
    if len(loader.duplicates) > MAX_ISSUES:
        return  # enough said; finding the first line of each would cost time
    first_lines: dict[Any, int] | None = loader.first_lines.get(id(node))
    if first_lines is None:  # this mapping's first duplicate: index its keys once
        first_lines = {}
        loader.first_lines[id(node)] = first_lines
        for other, _ in node.value:
            if other.tag in (_STR, _INT) and isinstance(other, yaml.ScalarNode):
                name = other.value if other.tag == _STR else loader.construct_object(other)
                first_lines.setdefault(name, int(other.start_mark.line) + 1)
    first = first_lines.get(key, int(node.start_mark.line) + 1)
    loader.duplicates.append(DuplicateKeyError(key, key_node.start_mark, first))


_COLLECTION_TAGS: dict[str, Any] = {
    "tag:yaml.org,2002:map": yaml.MappingNode,
    "tag:yaml.org,2002:set": yaml.MappingNode,
    "tag:yaml.org,2002:seq": yaml.SequenceNode,
    "tag:yaml.org,2002:omap": yaml.SequenceNode,
    "tag:yaml.org,2002:pairs": yaml.SequenceNode,
}
_NODE_KINDS = {yaml.MappingNode: "a mapping", yaml.SequenceNode: "a sequence"}


def _construct_object(self: Any, node: Any, deep: bool = False) -> Any:
    """PyYAML's, with content of the wrong kind for its tag (`!!seq {a: 1}`, `!!bool maybe`)
    reported at the node instead of escaping as a KeyError or TypeError from deep inside."""
    expected = _COLLECTION_TAGS.get(node.tag)
    if expected is not None and not isinstance(node, expected):
        raise yaml.constructor.ConstructorError(
            None, None, f"{_short_tag(node.tag)} needs {_NODE_KINDS[expected]}", node.start_mark
        )
    try:
        return _BaseConstructObject(self, node, deep)
    except yaml.YAMLError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError):
        what = shorten(repr(node.value), 80) if isinstance(node, yaml.ScalarNode) else "this"
        raise yaml.constructor.ConstructorError(
            None, None, f"{what} is not a valid {_short_tag(node.tag)}", node.start_mark
        ) from None


def _flatten_mapping(self: Any, node: Any) -> None:
    """PyYAML's merge-key expansion, after checking the keys written in the mapping itself
    (a key may override a merged one, but not another written one)."""
    if id(node) not in self.flattened:  # a merged mapping is flattened again wherever it is
        self.flattened.add(id(node))
        seen: dict[tuple[str, str], Any] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                continue
            first = seen.setdefault((key_node.tag, key_node.value), key_node)
            if first is not key_node and len(self.duplicates) <= MAX_ISSUES:
                line = int(first.start_mark.line) + 1
                self.duplicates.append(
                    DuplicateKeyError(key_node.value, key_node.start_mark, line)
                )
    _BaseFlattenMapping(self, node)


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml") else tag


_MERGE = "tag:yaml.org,2002:merge"
_BaseResolve = _Base.resolve
_BaseConstructDocument = _Base.construct_document
_BaseConstructObject = _Base.construct_object
_BaseFlattenMapping = _Base.flatten_mapping
FastLoader.resolve = _resolve
FastLoader.construct_document = _construct_document
FastLoader.construct_object = _construct_object
FastLoader.flatten_mapping = _flatten_mapping


class Documents:
    """The documents of one text, read one at a time: `for node, data in Documents(text)`.

    Each document's `node` (with positions) is yours to keep for locating errors, or to drop:
    keeping every node of a large file would double the memory of loading it. Iterating raises
    yaml.YAMLError on bad syntax, a tag on the wrong kind of content or a broken limit (see
    `yaml_limits`); all but reader errors carry a `problem_mark`.
    """

    def __init__(self, text: str):
        self._text = text
        self.duplicates: list[DuplicateKeyError] = []
        """Keys repeated within a mapping so far (the last one wins), each with its mark."""

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        loader = FastLoader(self._text)
        loader.duplicates = self.duplicates
        try:
            while loader.check_node():
                node = loader.get_node()
                yield node, loader.construct_document(node)
        finally:
            loader.dispose()
