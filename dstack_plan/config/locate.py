"""Find the line and column of a path inside a YAML file.

Loading uses the fast C parser, which keeps no positions; only when something is wrong do we
parse the file again with ruamel's round-trip loader, which remembers where every key and value
came from. Valid input never pays for positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

Target = Literal["key", "value"]
PathItem = str | int | bool | None


@dataclass(frozen=True)
class Position:
    line: int
    """1-based."""
    column: int
    """1-based."""


class Locator:
    """Positions within one file's text; parses lazily, at most once."""

    def __init__(self, text: str):
        self._text = text
        self._documents: list[Any] | None = None

    def _load(self) -> list[Any]:
        if self._documents is None:
            yaml = YAML(typ="rt")
            yaml.allow_duplicate_keys = True
            try:
                self._documents = list(yaml.load_all(self._text))
            except Exception:  # noqa: BLE001 - positions are best effort; the fast loader accepted it
                self._documents = []
        return self._documents

    def document_start(self, document: int) -> Position:
        docs = self._load()
        if document < len(docs) and isinstance(docs[document], CommentedMap | CommentedSeq):
            node = docs[document]
            return Position(node.lc.line + 1, node.lc.col + 1)
        return Position(1, 1)

    def find(self, document: int, path: Sequence[PathItem], target: Target = "value") -> Position:
        """Position of the key or value at `path`; the nearest existing ancestor otherwise."""
        docs = self._load()
        if document >= len(docs):
            return Position(1, 1)
        node = docs[document]
        best = self.document_start(document)
        for depth, item in enumerate(path):
            last = depth == len(path) - 1
            if isinstance(node, CommentedMap):
                key = _matching_key(node, item)
                if key is None:
                    return best
                line, col = node.lc.key(key) if (last and target == "key") else node.lc.value(key)
                best = Position(line + 1, col + 1)
                node = node[key]
            elif (
                isinstance(node, CommentedSeq) and isinstance(item, int) and 0 <= item < len(node)
            ):
                line, col = node.lc.item(item)
                best = Position(line + 1, col + 1)
                node = node[item]
            else:
                return best
        return best


def _matching_key(node: CommentedMap, item: PathItem) -> Any:
    if item in node:
        return item
    # The fast loader reads YAML 1.1 (`on:` is True); round-trip reads 1.2 (`on:` is "on").
    for key in node:
        if str(key).lower() == str(item).lower():
            return key
    return None
