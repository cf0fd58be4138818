"""Find the line and column of a path inside a YAML file.

Loading builds plain Python data, which keeps no positions; only when something is wrong do we
compose the file again (libyaml's C parser, so a large file costs a fraction of a second) into
nodes, which remember where every key and value came from. Valid input never pays for positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from dstack_plan.config.yaml_fast import FastLoader
from dstack_plan.config.yaml_limits import MAX_DEPTH

Target = Literal["key", "value"]
PathItem = str | int | bool | None

_MERGE = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Position:
    line: int
    """1-based."""
    column: int
    """1-based."""


class Locator:
    """Positions within one file's text; parses lazily, at most once."""

    def __init__(self, text: str, nodes: Mapping[int, Any] | None = None):
        """`nodes`: document index -> node, for the documents the loader kept the nodes of
        (the text is composed again if they are not given)."""
        self._text = text
        self._documents: Mapping[int, Any] | None = nodes
        self._keys: dict[int, dict[Any, tuple[Any, Any]]] = {}  # id(mapping node) -> its keys
        self._folded: dict[int, dict[str, tuple[Any, Any]]] = {}  # the same, lowercased
        self._loader: Any = None

    def _load(self) -> Mapping[int, Any]:
        if self._documents is None:
            documents: dict[int, Any] = {}
            self._documents = documents
            loader = FastLoader(self._text)
            try:
                while loader.check_node():
                    documents[len(documents)] = loader.get_node()
            except Exception:  # noqa: BLE001 - positions are best effort: keep what composed
                pass
            finally:
                loader.dispose()
        return self._documents

    def document_start(self, document: int) -> Position:
        node = self._load().get(document)
        return Position(1, 1) if node is None else _position(node)

    def find(self, document: int, path: Sequence[PathItem], target: Target = "value") -> Position:
        """Position of the key or value at `path`; the nearest existing ancestor otherwise."""
        node = self._load().get(document)
        if node is None:
            return Position(1, 1)
        best = _position(node)
        for depth, item in enumerate(path):
            last = depth == len(path) - 1
            if isinstance(node, yaml.MappingNode):
                pair = self._pair(node, item)
                if pair is None:
                    return best
                key_node, node = pair
                best = _position(key_node if (last and target == "key") else node)
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(item, int)
                and not isinstance(item, bool)
                and 0 <= item < len(node.value)
            ):
                node = node.value[item]
                best = _position(node)
            else:
                return best
        return best

    def _pair(self, node: Any, item: PathItem) -> tuple[Any, Any] | None:
        keys = self._keys.get(id(node))
        if keys is None:
            keys = self._keys[id(node)] = self._index(node, set())
        try:
            found = keys.get(item)
        except TypeError:  # an unhashable path item: no such key
            return None
        if found is not None:
            return found
        # The loader reads YAML 1.1 (`on:` is True), but a message may name the key as written.
        folded = self._folded.get(id(node))
        if folded is None:
            folded = self._folded[id(node)] = {}
            for key, pair in keys.items():
                folded.setdefault(str(key).lower(), pair)
        return folded.get(str(item).lower())

    def _index(self, node: Any, visiting: set[int]) -> dict[Any, tuple[Any, Any]]:
        """The keys of a mapping node, merged ones (`<<:`) included, as the loader builds them."""
        visiting.add(id(node))
        own: dict[Any, tuple[Any, Any]] = {}
        merged: dict[Any, tuple[Any, Any]] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                sources = (
                    value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                )
                for source in sources:
                    if (
                        isinstance(source, yaml.MappingNode)
                        and id(source) not in visiting
                        and len(visiting) < MAX_DEPTH  # merges of merges: bounded recursion
                    ):
                        for key, pair in self._index(source, visiting).items():
                            merged.setdefault(key, pair)  # the first merged mapping wins
                continue
            key = self._key(key_node)
            if key is not None:
                own[key] = (key_node, value_node)  # a repeated key: the last one wins
        visiting.discard(id(node))
        return {**merged, **own}

    def _key(self, node: Any) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return None
        if node.tag == "tag:yaml.org,2002:str":
            return node.value
        if self._loader is None:
            self._loader = FastLoader("")
        try:
            key = self._loader.construct_object(node, deep=True)
            hash(key)
        except Exception:  # noqa: BLE001 - a key the loader could not build is no match
            return node.value
        return key


def _position(node: Any) -> Position:
    mark = node.start_mark
    return Position(int(mark.line) + 1, int(mark.column) + 1)
