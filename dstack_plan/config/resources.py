"""The `resources:` block of a run or fleet: CPU, memory, shared memory, disk and GPU.

Each spec accepts dstack's shorthand strings as well as the object form, prints canonically
(`cpu=2.. mem=8GB.. disk=100GB.. gpu=A100:80GB:2`) and serialises to that compact form, so
parsing what was printed or dumped gives an equal model. The `gpu:` spec lives in
`dstack_plan.config.gpu`, the shorthand plumbing all specs share in `dstack_plan.config.spec_text`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from dstack_plan.config.base import ItemError, drop_nulls, is_stored, null_in_schema
from dstack_plan.config.described import Described
from dstack_plan.config.gpu import GPUSpec
from dstack_plan.config.ranges import CountRange, MemoryRange
from dstack_plan.config.spec_text import (
    COUNT_RANGE,
    FROZEN,
    Spec,
    any_case,
    check_keys,
    parse_range,
    split_parts,
)
from dstack_plan.config.units import Memory, anchored, describe, format_memory

__all__ = ["CPUArch", "CPUSpec", "DiskSpec", "ResourcesSpec"]


# --- CPU ------------------------------------------------------------------------------------


class CPUArch(str, Enum):
    """CPU architecture."""

    X86 = "x86"
    ARM = "arm"


_ARCHES = {arch.value: arch for arch in CPUArch}
_ARCH_PATTERN = "|".join(any_case(arch.value) for arch in CPUArch)


def _parse_arch(what: str, value: object) -> CPUArch:
    if isinstance(value, CPUArch):
        return value
    arch = _ARCHES.get(value.strip().lower()) if isinstance(value, str) else None
    if arch is None:
        raise ValueError(
            f"invalid {what}: {describe(value)} is neither a count range nor an arch (x86 or arm)"
        )
    return arch


class CPUSpec(Spec):
    """`cpu:`: a vCPU count range (default `2..`) and an optional arch (`x86` or `arm`).

    Accepts `16..`, `arm:8..`, `x86:16`, an integer, `{arch, count}`, or a count range as
    `{min, max}` (either bound alone too, as `memory:` takes it); prints `[arch:]count`.
    """

    arch: CPUArch | None = None
    count: CountRange = CountRange(min=2)

    _what: ClassVar[str] = "cpu spec"
    _forms: ClassVar[str] = (
        "a count range, optionally with an arch (x86 or arm), e.g. 16.., arm:8.., x86:16, "
        "{min, max} or {arch, count}"
    )

    @classmethod
    def _parse_text(cls, text: str) -> dict[str, Any]:
        what = f"cpu spec {describe(text)}"
        fields: dict[str, Any] = {}
        for part in split_parts(what, cls._forms, text, max_parts=2):
            parsed: object
            if part.isdigit() or ".." in part:
                key, parsed = "count", parse_range(CountRange, part, what)
            else:
                key, parsed = "arch", _parse_arch(what, part)
            if key in fields:
                raise ValueError(f"invalid {what}: {key} given twice")
            fields[key] = parsed
        return fields

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> dict[str, Any]:
        # CPUSpec has no min or max of its own: such a mapping can only be the count range.
        if mapping and mapping.keys() <= {"min", "max"}:
            return {"count": parse_range(CountRange, mapping)}
        check_keys(cls._what, mapping, ("arch", "count"))
        fields = dict(mapping)
        if fields.get("arch") is not None:
            fields["arch"] = _parse_arch(cls._what, fields["arch"])
        # count is left to pydantic so that its errors point at the key.
        return fields

    @classmethod
    def _user_schema(cls) -> dict[str, Any]:
        part = rf"{COUNT_RANGE}|{_ARCH_PATTERN}"
        return {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": anchored(rf"(?:{part})(?:\s*:\s*(?:{part}))?")},
                {
                    "type": "object",
                    "properties": {
                        "arch": {"type": "string", "pattern": anchored(_ARCH_PATTERN)},
                        "count": CountRange.model_json_schema(),
                    },
                    "additionalProperties": False,
                },
                CountRange.model_json_schema()["anyOf"][2],
            ]
        }

    def __str__(self) -> str:
        return f"{self.arch.value}:{self.count}" if self.arch else str(self.count)


# --- disk -----------------------------------------------------------------------------------


class DiskSpec(Spec):
    """`disk:`: a size range (default `100GB..`); a memory range or `{size: range}`."""

    size: MemoryRange = MemoryRange(min=100.0)

    _what: ClassVar[str] = "disk spec"
    _forms: ClassVar[str] = "a size range such as 100GB.. or 200GB..1TB, or {size: range}"

    @classmethod
    def _parse_text(cls, text: str) -> dict[str, Any]:
        return {"size": parse_range(MemoryRange, text)}

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> dict[str, Any]:
        # An empty mapping is the object form with every default, not an empty range.
        if "size" in mapping or not mapping:
            check_keys(cls._what, mapping, ("size",))
            return mapping
        return {"size": parse_range(MemoryRange, mapping)}

    # Disk has no count: a bare number is a size in GB, not the base class's count.
    @classmethod
    def _parse_number(cls, number: int | float) -> dict[str, Any]:
        return {"size": parse_range(MemoryRange, number)}

    @classmethod
    def _user_schema(cls) -> dict[str, Any]:
        size = MemoryRange.model_json_schema()
        mapping = {
            "type": "object",
            "properties": {"size": size},
            "required": ["size"],
            "additionalProperties": False,
        }
        return {"anyOf": [*size["anyOf"], mapping]}

    def __str__(self) -> str:
        return str(self.size)


# --- resources ------------------------------------------------------------------------------


class ResourcesSpec(BaseModel):
    """`resources:`, each field accepting its shorthand; `str()` is the pretty one-liner."""

    model_config = ConfigDict(**FROZEN, json_schema_extra=null_in_schema)

    cpu: CPUSpec = CPUSpec()
    memory: MemoryRange = MemoryRange(min=8.0)
    shm_size: Memory | None = None
    disk: DiskSpec = DiskSpec()
    gpu: GPUSpec = GPUSpec(count=CountRange(min=0))

    _described: ClassVar[Described] = Described("a mapping {cpu, memory, shm_size, disk, gpu}")
    null_kept: ClassVar[frozenset[str]] = frozenset({"cpu", "memory"})
    """dstack's parser takes `gpu: null` and `disk: null` as unset, but not these two."""

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        return drop_nulls(cls, data)

    # Checked here, not in DiskSpec: a spec parsed from text is cached and shared, while
    # this check must not apply to stored specs (see `is_stored`).
    @field_validator("disk", "memory")
    @classmethod
    def _not_zero(cls, value: DiskSpec | MemoryRange, info: ValidationInfo) -> Any:
        size = value.size if isinstance(value, DiskSpec) else value
        if size.max == 0 and not is_stored(info):
            what = "disk size" if info.field_name == "disk" else "memory"
            raise ItemError(f"{what} must be greater than 0GB", "size")
        return value

    def pretty(self) -> str:
        """`cpu=2.. mem=8GB.. disk=100GB..`, then `gpu=...` unless default, `shm=...` if set."""
        parts = [f"cpu={self.cpu}", f"mem={self.memory}", f"disk={self.disk}"]
        if self.gpu != _DEFAULT_GPU:
            parts.append(f"gpu={self.gpu}")
        if self.shm_size is not None:
            parts.append(f"shm={format_memory(self.shm_size)}")
        return " ".join(parts)

    def __str__(self) -> str:
        return self.pretty()


_DEFAULT_GPU: GPUSpec = ResourcesSpec.model_fields["gpu"].default
