"""Finding the resource a command names: an address (`fleet.gpu`) or a bare name (`gpu`)."""

from __future__ import annotations

from collections.abc import Collection

from dstack_plan.errors import DstackPlanError
from dstack_plan.state.model import ResourceState, State


def find_entry(
    state: State, ref: str, kinds: Collection[str] | None = None, noun: str = "resource"
) -> ResourceState:
    """The resource `ref` names, among those of `kinds` (default: any kind).

    Raises DstackPlanError listing the known ones (`noun`s) when nothing matches, or naming
    the matches when a bare name is the name of resources of several kinds."""
    entries = [r for _, r in sorted(state.resources.items()) if kinds is None or r.kind in kinds]
    if "." in ref:
        matches = [r for r in entries if r.address == ref]
    else:
        matches = [r for r in entries if r.name == ref]
    if len(matches) == 1:
        return matches[0]
    if matches:
        options = ", ".join(r.address for r in matches)
        raise DstackPlanError(f"{ref!r} is ambiguous: it names {options}; give the address")
    known = ", ".join(r.address for r in entries) or "none"
    raise DstackPlanError(f"no {noun} {ref!r} in state (known {noun}s: {known})")
