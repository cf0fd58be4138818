"""The state model: what exists, keyed by `<kind>.<name>` address, with lineage and serial.

The model knows nothing about resource kinds: `spec` and `attributes` are opaque JSON owned by
the config and provider packages. Serial numbers are assigned by the backends on write (see
`backend.prepare_write`), never by the helpers here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from functools import cache
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dstack_plan.clock import Clock
from dstack_plan.state import derivation
from dstack_plan.state.canonical import canonical_json
from dstack_plan.state.canonical import spec_hash as compute_spec_hash
from dstack_plan.state.exports import Export

FORMAT_VERSION = 1
"""The newest state format this code reads and the one it writes."""

MAX_ADDRESS_LENGTH = 200
_ADDRESS_RE = re.compile(r"([a-z][a-z0-9-]*)\.([A-Za-z0-9_][A-Za-z0-9_-]*)")


def parse_address(address: str) -> tuple[str, str]:
    """Split a `<kind>.<name>` address; raise ValueError naming it when the shape is wrong."""
    match = _ADDRESS_RE.fullmatch(address) if len(address) <= MAX_ADDRESS_LENGTH else None
    if match is None:
        raise ValueError(
            f"invalid resource address {address!r}: expected <kind>.<name>, e.g. fleet.gpu-pool"
            " (kind: lowercase letters, digits, '-'; name: letters, digits, '-', '_')"
        )
    return match.group(1), match.group(2)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


Timestamp = Annotated[AwareDatetime, AfterValidator(_to_utc)]
"""A timezone-aware datetime, normalised to UTC so the file reads the same everywhere."""

JsonObject = dict[str, JsonValue]


@cache
def _json_object() -> TypeAdapter[JsonObject]:
    """Built when a refresh first needs it, not at every command's start."""
    return TypeAdapter(JsonObject)


def timestamp(clock: Clock) -> datetime:
    """The clock's current time as a UTC datetime, for `created_at` / `updated_at`."""
    return datetime.fromtimestamp(clock.now(), tz=timezone.utc)


_UPDATABLE_FIELDS = frozenset(
    {"provider", "spec", "attributes", "status", "depends_on", "tainted", "submitted"}
)


class ResourceState(BaseModel):
    """What state remembers about one resource: its normalised spec and what the provider made.

    `spec_hash` is filled from `spec` when omitted and checked when given, so a hand-edited
    spec cannot silently disagree with its hash.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    name: str
    provider: str
    spec: JsonObject
    spec_hash: str = Field(default="", validate_default=True)
    attributes: JsonObject = Field(default_factory=dict)
    status: str
    depends_on: tuple[str, ...] = ()
    """Addresses, sorted and without repeats."""
    created_at: Timestamp
    updated_at: Timestamp
    tainted: bool = False
    submitted: bool = Field(default=False, exclude_if=lambda value: not value)
    """Created by a submission (`dstack apply -f`, the SDK) and not found in the project
    directory's files since: a directory apply keeps it instead of deleting it. Written
    only when true, so declared entries read as they always did."""

    @field_validator("spec_hash")
    @classmethod
    def _fill_spec_hash(cls, value: str, info: ValidationInfo) -> str:
        spec = info.data.get("spec")
        if spec is None:  # spec itself failed validation; that error is the one to report
            return value
        expected = compute_spec_hash(spec)
        if value and value != expected:
            raise ValueError(
                f"does not match spec (spec hashes to {expected}); was the state edited by hand?"
            )
        return expected

    @field_validator("depends_on")
    @classmethod
    def _normalise_depends_on(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # One validator for the whole tuple rather than one per address: a state holds
        # tens of thousands of them and is read by every plan.
        for address in value:
            parse_address(address)
        # Order carries no meaning; sorting keeps the file canonical and comparisons simple.
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _check_address_parts(self) -> ResourceState:
        parse_address(self.address)
        if self.address in self.depends_on:
            raise ValueError(f"{self.address} depends on itself")
        return self

    @property
    def address(self) -> str:
        """`<kind>.<name>`, the key of this resource in `State.resources`."""
        return f"{self.kind}.{self.name}"

    @classmethod
    def create(
        cls,
        address: str,
        *,
        provider: str,
        spec: Mapping[str, Any],
        status: str,
        now: datetime,
        attributes: Mapping[str, Any] | None = None,
        depends_on: Iterable[str] = (),
        tainted: bool = False,
        submitted: bool = False,
    ) -> ResourceState:
        """Build a new entry for `address` with `created_at == updated_at == now`."""
        kind, name = parse_address(address)
        return cls.model_validate(
            {
                "kind": kind,
                "name": name,
                "provider": provider,
                "spec": dict(spec),
                "attributes": dict(attributes or {}),
                "status": status,
                "depends_on": tuple(depends_on),
                "created_at": now,
                "updated_at": now,
                "tainted": tainted,
                "submitted": submitted,
            }
        )

    def refreshed(self, status: str, attributes: dict[str, Any]) -> ResourceState:
        """A copy with the `status` and `attributes` a refresh found, as `updated(now=
        self.updated_at, ...)` makes it, validating only the attributes (the spec and its hash
        are this entry's own): 12 us an entry against `updated`'s 87, which a no-op plan of
        10,000 runs pays for each (3.35 s instead of 3.8 s)."""
        return self.model_copy(
            update={"status": status, "attributes": _json_object().validate_python(attributes)}
        )

    def updated(self, *, now: datetime, **changes: Any) -> ResourceState:
        """Return a copy with `changes` applied and `updated_at = now`, or `self` if unchanged.

        Returning `self` for a no-op keeps `updated_at` still, so re-committing the same facts
        does not count as a content change (and does not bump the serial).
        Allowed fields: provider, spec, attributes, status, depends_on, tainted, submitted.
        """
        unknown = set(changes) - _UPDATABLE_FIELDS
        if unknown:
            raise TypeError(f"cannot update {', '.join(sorted(unknown))} of a resource state")
        data = self.model_dump()
        data.update(changes)
        del data["spec_hash"]  # recomputed from the new spec
        candidate = type(self).model_validate(data)
        if candidate == self:
            return self
        data["updated_at"] = now
        return type(self).model_validate(data)


class State(BaseModel):
    """A whole state: every resource by address, plus the identity of this state's history.

    `lineage` is fixed when the state is born; `serial` counts persisted content changes.
    Instances are immutable: the helpers return new states and leave `serial` alone.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int = FORMAT_VERSION
    lineage: str
    serial: int = Field(default=0, ge=0)
    resources: dict[str, ResourceState] = Field(default_factory=dict)
    """By address; `_check_keys` holds each key to its resource's own (validated) address."""
    exports: dict[str, Export] = Field(default_factory=dict, exclude_if=lambda value: not value)
    """What this project shares with other projects, by export name (`state/exports.py`);
    left out of the file while there are none, so older states read and write the same."""
    policy: JsonObject = Field(default_factory=dict, exclude_if=lambda value: not value)
    """What the owner publishes for the projects it exports to (their quotas and fair shares:
    `sharing/policy.py`); opaque here, left out of the file while empty."""

    @field_validator("format_version")
    @classmethod
    def _check_format_version(cls, value: int) -> int:
        if value != FORMAT_VERSION:
            raise ValueError(f"unsupported format_version {value} (this code knows 1)")
        return value

    @field_validator("lineage")
    @classmethod
    def _check_lineage(cls, value: str) -> str:
        try:
            parsed = uuid.UUID(value)
        except ValueError:
            raise ValueError(f"lineage must be a UUID, got {value!r}") from None
        return str(parsed)

    @model_validator(mode="after")
    def _check_keys(self) -> State:
        for address, resource in self.resources.items():
            if resource.address != address:
                raise ValueError(
                    f"resource under {address!r} has kind {resource.kind!r} and name "
                    f"{resource.name!r}, which make the address {resource.address!r}"
                )
        return self

    @classmethod
    def empty(cls) -> State:
        """A state with a fresh lineage, serial 0 and no resources."""
        return cls(lineage=str(uuid.uuid4()), serial=0, resources={})

    @property
    def addresses(self) -> list[str]:
        """All resource addresses, sorted."""
        return sorted(self.resources)

    def get(self, address: str) -> ResourceState | None:
        """The resource at `address`, or None."""
        return self.resources.get(address)

    def with_resource(self, resource: ResourceState) -> State:
        """A new state with `resource` added or replacing the entry at its address."""
        if self.resources.get(resource.address) == resource:
            return self
        resources = self.resources.copy()
        resources[resource.address] = resource
        # Both parts are already validated and the key is derived from the value.
        return self._derived(resources, resource.address)

    def without(self, address: str) -> State:
        """A new state without `address`; `self` if it is absent (so retries stay idempotent)."""
        if address not in self.resources:
            return self
        # `copy()`, not `dict()`: a delete leaves a hole that sends `dict()` down its slow path
        # (10,000 entries: 0.36 ms against 0.03 ms), and a destroy copies one after another
        resources = self.resources.copy()
        del resources[address]
        return self._derived(resources, address)

    def _derived(self, resources: dict[str, ResourceState], address: str) -> State:
        derived = self.model_copy(update={"resources": resources})
        derivation.record(derived, self, address)
        return derived

    def touched_since(self, ancestor: State) -> frozenset[str] | None:
        """The addresses whose entries may differ from `ancestor`'s, when this state was made
        from it by `with_resource` and `without` (a superset: a step may have been undone);
        None when not known, and every entry must be compared."""
        return derivation.touched_since(self, ancestor)

    def same_content(self, other: State) -> bool:
        """True when both states hold the same resources, exports and published policy
        (lineage and serial aside)."""
        return (
            self.resources == other.resources
            and self.exports == other.exports
            and self.policy == other.policy
        )

    def to_json(self) -> str:
        """The canonical file form: sorted keys, 2-space indent, trailing newline."""
        return canonical_json(self.model_dump(mode="json"))
