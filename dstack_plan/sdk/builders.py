"""Configurations built in Python: one class per kind, taking the fields a YAML document has
(`Task(commands=["python train.py"], resources={"gpu": "A100:2"})`) and validated by the
same models, with the same messages, as a file's documents are.

    task = Task(name="train", commands=["python train.py"], resources={"gpu": 1})
    Project(".", configs=[task.resource()])   # beside the project's *.dstack.yml files
"""

from __future__ import annotations

from typing import Any, ClassVar

from dstack_plan.config.loader import load_mapping
from dstack_plan.config.resource import Resource
from dstack_plan.errors import DstackPlanError

SOURCE = "<python>"
"""Where a resource built in Python says it was declared."""


class SpecError(DstackPlanError, ValueError):
    """A configuration built in Python is not valid; each problem names its field path."""

    def __init__(self, what: str, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(f"{what}: {p}" for p in problems))


class Config:
    """A configuration of one kind, its fields as a YAML document would have them. `None`
    values are left out (as a key not written), so optional arguments can be passed through."""

    kind: ClassVar[str]

    def __init__(self, **fields: Any) -> None:
        self.fields: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}

    @property
    def name(self) -> str | None:
        name = self.fields.get("name")
        return name if isinstance(name, str) else None

    def to_dict(self) -> dict[str, Any]:
        """The document: `type` and the fields given."""
        return {"type": self.kind, **self.fields}

    def resource(self) -> Resource:
        """The validated resource (a name derived as for a file's document without one);
        SpecError listing every problem otherwise."""
        resource, problems = load_mapping(self.to_dict(), SOURCE)
        if resource is None:
            raise SpecError(repr(self), problems)
        return resource

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.fields.items() if k == "name")
        return f"{type(self).__name__}({shown})"


class Task(Config):
    kind = "task"


class Service(Config):
    kind = "service"


class DevEnvironment(Config):
    kind = "dev-environment"


class Fleet(Config):
    kind = "fleet"


class Volume(Config):
    kind = "volume"


class Gateway(Config):
    kind = "gateway"
