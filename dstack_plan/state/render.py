"""Writing a state file fast: each resource entry rendered once, reused while it is unchanged.

A commit changes one resource of a state that may hold ten thousand; rendering all of them
again (`State.to_json`) costs a third of a second there. A `Renderer` keeps the canonical JSON
of every entry of the last state it rendered, keyed by the entry object (entries are immutable,
and a mutation replaces the entry it changes), so the next render only renders the changed
ones and joins the rest. The output is byte-identical to `State.to_json()`.
"""

from __future__ import annotations

from collections.abc import Mapping

from dstack_plan.state.canonical import canonical_json
from dstack_plan.state.model import ResourceState, State

_ENTRY_INDENT = "\n    "
"""An entry sits two levels deep (state -> resources -> address), 2 spaces a level."""


class Renderer:
    """Renders states to their canonical file form, remembering the last one's entries."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[ResourceState, str]] = {}
        """id(entry) -> (the entry, kept alive so the id stays its own; its line(s) in the
        file, address included: an entry's address is its kind and name, so it is the same
        for the same entry)."""

    def render(self, state: State) -> bytes:
        """`state.to_json()` as UTF-8 bytes, rendering only entries not seen last time."""
        kept: dict[int, tuple[ResourceState, str]] = {}
        parts = []
        for address in sorted(state.resources):
            entry = state.resources[address]
            known = self._entries.get(id(entry))
            if known is None or known[0] is not entry:
                text = canonical_json(entry.model_dump(mode="json"))[:-1]
                key = canonical_json(address)[:-1]
                known = (entry, f"    {key}: {text.replace(chr(10), _ENTRY_INDENT)}")
            kept[id(entry)] = known
            parts.append(known[1])
        self._entries = kept  # only the last state's: memory stays one state's worth
        resources = "{\n" + ",\n".join(parts) + "\n  }" if parts else "{}"
        exports = {name: e.model_dump(mode="json") for name, e in state.exports.items()}
        return (
            "{\n"
            f"{_top_level('exports', exports)}"
            f'  "format_version": {state.format_version},\n'
            f'  "lineage": {canonical_json(state.lineage)[:-1]},\n'
            f"{_top_level('policy', state.policy)}"
            f'  "resources": {resources},\n'
            f'  "serial": {state.serial}\n'
            "}\n"
        ).encode()


def _top_level(key: str, value: Mapping[str, object]) -> str:
    """A top-level field left out while empty (exports, policy): few and small, so rendered
    whole each time."""
    if not value:
        return ""
    return f'  "{key}": {canonical_json(value)[:-1].replace(chr(10), chr(10) + "  ")},\n'
