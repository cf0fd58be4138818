"""A loaded resource and the set of them a project declares (the desired side of a plan)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from dstack_plan.config.kinds import AnySpec


STATE_SOURCE = "<state>"
"""The file of a resource a submission rebuilt from the project's state (`plan/submissions`)."""


class Source(NamedTuple):
    """Where a resource was declared."""

    file: str
    """Path as shown to the user (relative to the project directory when inside it)."""
    document: int
    """0-based index of the YAML document in the file."""

    def __str__(self) -> str:
        return self.file if self.document == 0 else f"{self.file} (document {self.document + 1})"


@dataclass(frozen=True)
class Resource:
    kind: str
    name: str
    spec: AnySpec
    source: Source
    name_derived: bool = False
    """True when the file gave no `name:` and one was derived from the file path."""
    may_reference: bool = True
    """False when the document cannot hold a `${{ ... }}` reference: its file has neither
    `${{` nor a backslash (the only way to spell one without writing it out)."""

    @property
    def address(self) -> str:
        return f"{self.kind}.{self.name}"

    @cached_property
    def normalized(self) -> dict[str, Any]:
        """The JSON form of the spec that state stores and the diff compares: defaults filled,
        units in canonical form, the (possibly derived) name included.

        Computed once; the loader computes it where it parses (on several cores for a large
        project) when planning will need it.
        """
        data = self.spec.model_dump(mode="json", exclude_none=True)
        data["name"] = self.name
        return data


@dataclass(frozen=True)
class Desired:
    """Every resource a project declares, keyed by address, in declaration order.

    Configurations that are no resources (presets) are kept apart in `presets`: planning,
    the graph and apply see only `resources`.
    """

    resources: dict[str, Resource] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    presets: dict[str, Resource] = field(default_factory=dict)
    submission: bool = False
    """Given to a submission (`-f`, the SDK): the resources from `STATE_SOURCE` beside the
    files' are the state entries they may refer to."""

    def __post_init__(self) -> None:
        from dstack_plan.config.kinds import CONFIG_ONLY_KINDS  # noqa: PLC0415 - a cycle

        # the loader hands over every document it loaded; presets move out of `resources`
        if any(r.kind in CONFIG_ONLY_KINDS for r in self.resources.values()):
            kept = {a: r for a, r in self.resources.items() if r.kind not in CONFIG_ONLY_KINDS}
            moved = {a: r for a, r in self.resources.items() if r.kind in CONFIG_ONLY_KINDS}
            object.__setattr__(self, "resources", kept)
            object.__setattr__(self, "presets", {**self.presets, **moved})

    def __iter__(self) -> Iterator[Resource]:
        return iter(self.resources.values())

    def __len__(self) -> int:
        return len(self.resources)

    def of_kind(self, *kinds: str) -> list[Resource]:
        return [r for r in self.resources.values() if r.kind in kinds]
