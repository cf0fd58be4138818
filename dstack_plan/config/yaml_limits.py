"""Limits that keep hostile YAML cheap: alias expansion, nesting depth, and located errors.

A few hundred bytes of anchors and aliases ("billion laughs") describe a document of 10^9
nodes. The loader shares aliased objects instead of copying them, but everything after it
(validation, interpolation checks, error messages) walks the document as a tree, so a document
whose aliases expand it far beyond its written size is refused before anyone walks it, as
Kubernetes' YAML reader does. Deep nesting is refused for the same reason: every later step
recurses.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 500
"""Deepest nesting of mappings and sequences accepted in a document."""
MAX_ISSUES = 100
"""Problems reported per file, at most; past that, one more issue says that there are more."""
ALIAS_FACTOR = 10
"""Aliases may make a document this many times larger than it is written..."""
ALIAS_FLOOR = 10_000
"""...though a document of up to this many nodes, expanded, is always accepted..."""
ALIAS_CEILING = 1_000_000
"""...and aliases may never add more than this many nodes."""


class LimitError(yaml.MarkedYAMLError):
    """A document breaks one of the limits above; `problem_mark` says where."""

    def __init__(self, problem: str, mark: Any):
        super().__init__(problem=problem, problem_mark=mark)


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping repeats a key; `problem_mark` is the repeat, the message names the first."""

    def __init__(self, key: object, mark: Any, first_line: int):
        super().__init__(
            problem=f"duplicate key {shorten(repr(key), 80)} (first at line {first_line})",
            problem_mark=mark,
        )


def alias_limit(written: int) -> int:
    """The most nodes a document written with `written` nodes may expand to."""
    return max(ALIAS_FLOOR, min(ALIAS_FACTOR * written, written + ALIAS_CEILING))


def check_expansion(root: Any) -> None:
    """Raise LimitError if aliases (or merge keys) blow `root` up, recurse, or nest too deep.

    Linear in the number of distinct nodes: each node's expanded size and height is computed
    once, however many aliases point at it.
    """
    size: dict[int, int] = {}  # id(node) -> expanded node count, once finished
    height: dict[int, int] = {}  # id(node) -> mappings and sequences nested in it, itself too
    active: set[int] = set()  # nodes on the current path: meeting one again is a cycle
    written = 0
    largest: tuple[int, Any] = (0, None)  # the biggest node reached through an alias
    stack: list[tuple[Any, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        children = _children(node)
        if children_done:
            active.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            height[key] = (
                (1 + max((height[id(c)] for c in children), default=0))
                if (isinstance(node, yaml.CollectionNode))
                else 0
            )
            continue
        written += 1
        if key in active:
            raise LimitError("an alias refers to a node that contains it", node.start_mark)
        if key in size:  # an alias (or a merge) of a finished node
            if depth - 1 + height[key] > MAX_DEPTH:
                raise LimitError(TOO_DEEP, node.start_mark)
            if size[key] > largest[0]:
                largest = (size[key], node)
            continue
        if depth > MAX_DEPTH and isinstance(node, yaml.CollectionNode):
            raise LimitError(TOO_DEEP, node.start_mark)
        active.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in reversed(children))
    expanded = size[id(root)]
    if expanded > alias_limit(written):
        raise LimitError(
            f"aliases expand this document to {expanded:,} nodes, more than allowed for "
            f"{written:,} written nodes ({alias_limit(written):,}); repeat the content instead",
            largest[1].start_mark if largest[1] is not None else root.start_mark,
        )


TOO_DEEP = f"mappings and sequences nested more than {MAX_DEPTH} levels deep"


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def shorten(text: str, limit: int = 300) -> str:
    """`text`, cut to about `limit` characters with a note of how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters in all)"
