"""The `resources:` block of a run or fleet: CPU, memory, shared memory, disk and GPU.

Each spec accepts dstack's shorthand strings as well as the object form, prints canonically
(`cpu=2.. mem=8GB.. disk=100GB.. gpu=A100:80GB:2`) and serialises to that compact form, so
parsing what was printed or dumped gives an equal model.
"""

from __future__ import annotations

import functools
import re
from enum import Enum
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import GetJsonSchemaHandler, JsonSchemaValue
from pydantic_core import CoreSchema
from typing_extensions import Self

from dstack_plan.config.units import (
    MEMORY_FRAGMENT,
    CountRange,
    Memory,
    MemoryRange,
    anchored,
    describe,
    format_memory,
    printed,
    range_fragment,
)

__all__ = [
    "KNOWN_GPUS",
    "CPUArch",
    "CPUSpec",
    "DiskSpec",
    "GPUSpec",
    "GPUVendor",
    "ResourcesSpec",
    "gpu_vendor_of",
    "infer_gpu_vendor",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
# No valid shorthand is longer; rejecting longer ones early bounds the work per value.
_MAX_TEXT = 200
_COUNT_RANGE = range_fragment(r"\d+")
_MEMORY_RANGE = range_fragment(MEMORY_FRAGMENT)


def _any_case(word: str) -> str:
    """A regex fragment matching `word` in any case (JSON Schema patterns have no flags)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def _split_parts(what: str, forms: str, text: str, max_parts: int) -> list[str]:
    """Split an `a:b:c` shorthand into stripped, non-empty parts."""
    if len(text) > _MAX_TEXT:
        raise ValueError(f"invalid {what}: too long; expected {forms}")
    parts = [part.strip() for part in text.split(":", max_parts)]
    if len(parts) > max_parts:
        raise ValueError(f"invalid {what}: more than {max_parts} parts; expected {forms}")
    if not all(parts):
        raise ValueError(f"invalid {what}: empty part; expected {forms}")
    return parts


_R = TypeVar("_R", CountRange, MemoryRange)


def _range(range_cls: type[_R], value: object, within: str | None = None) -> _R:
    """Parse a range; `within` names the enclosing shorthand in the error message."""
    try:
        return range_cls.parse(value)
    except ValueError as error:
        if within is None:
            raise
        raise ValueError(f"invalid {within}: {error}") from None


def _check_keys(what: str, mapping: dict[Any, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(str(key) for key in mapping if key not in allowed)
    if unknown:
        raise ValueError(
            f"invalid {what}: unknown key(s) {', '.join(unknown)}; expected {', '.join(allowed)}"
        )


class _Fields(dict):  # type: ignore[type-arg]
    """Fields a shorthand parser already validated: `_Spec._coerce` passes them straight on."""


class _Spec(BaseModel):
    """Shared plumbing: shorthand, mapping and number inputs, `str()` as the serialised form
    and a JSON Schema describing what users may write."""

    model_config = _FROZEN

    _what: ClassVar[str]
    _forms: ClassVar[str]

    @classmethod
    def _parse_text(cls, text: str) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _parse_number(cls, number: int | float) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _user_schema(cls) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def parse(cls, value: object) -> Self:
        """Parse any accepted form (e.g. a CLI `--gpu` value); raises ValueError."""
        if isinstance(value, str):
            return _spec_from_text(cls, str(value))
        return cls.model_validate(value)

    # A wrap validator runs before pydantic's own instance check, so it can hand back a
    # cached instance for a shorthand it has seen (specs are frozen, so sharing is safe).
    @model_validator(mode="wrap")
    @classmethod
    def _coerce(cls, value: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        if isinstance(value, str):
            return _spec_from_text(cls, str(value))
        if isinstance(value, cls):
            return value
        if type(value) is _Fields:
            return handler(dict(value))
        if isinstance(value, dict):
            return handler(cls._parse_mapping(value))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return handler(cls._parse_number(value))
        raise ValueError(f"invalid {cls._what} {describe(value)}: expected {cls._forms}")

    @model_serializer(mode="plain")
    def _serialize(self) -> Any:
        return printed(self)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return cls._user_schema()


_SpecT = TypeVar("_SpecT", bound=_Spec)


# Configs repeat the same few shorthands, and specs are immutable: parse each once. Callers
# pass an exact str, so YAML loaders' str subclasses never become (or pin) cache keys.
@functools.lru_cache(maxsize=1024)
def _spec_from_text(cls: type[_SpecT], text: str) -> _SpecT:
    return cls.model_validate(_Fields(cls._parse_text(text)))


# --- CPU ------------------------------------------------------------------------------------


class CPUArch(str, Enum):
    """CPU architecture."""

    X86 = "x86"
    ARM = "arm"


_ARCHES = {arch.value: arch for arch in CPUArch}
_ARCH_PATTERN = "|".join(_any_case(arch.value) for arch in CPUArch)


def _parse_arch(what: str, value: object) -> CPUArch:
    if isinstance(value, CPUArch):
        return value
    arch = _ARCHES.get(value.strip().lower()) if isinstance(value, str) else None
    if arch is None:
        raise ValueError(
            f"invalid {what}: {describe(value)} is neither a count range nor an arch (x86 or arm)"
        )
    return arch


class CPUSpec(_Spec):
    """`cpu:`: a vCPU count range (default `2..`) and an optional arch (`x86` or `arm`).

    Accepts `16..`, `arm:8..`, `x86:16`, an integer, or `{arch, count}`; prints `[arch:]count`.
    """

    arch: CPUArch | None = None
    count: CountRange = CountRange(min=2)

    _what: ClassVar[str] = "cpu spec"
    _forms: ClassVar[str] = (
        "a count range, optionally with an arch (x86 or arm), e.g. 16.., arm:8.., x86:16, "
        "or {arch, count}"
    )

    @classmethod
    def _parse_text(cls, text: str) -> dict[str, Any]:
        what = f"cpu spec {describe(text)}"
        fields: dict[str, Any] = {}
        for part in _split_parts(what, cls._forms, text, max_parts=2):
            if part.isdigit() or ".." in part:
                key, parsed = "count", _range(CountRange, part, what)
            else:
                key, parsed = "arch", _parse_arch(what, part)
            if key in fields:
                raise ValueError(f"invalid {what}: {key} given twice")
            fields[key] = parsed
        return fields

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> dict[str, Any]:
        _check_keys(cls._what, mapping, ("arch", "count"))
        fields = dict(mapping)
        if fields.get("arch") is not None:
            fields["arch"] = _parse_arch(cls._what, fields["arch"])
        # count is left to pydantic so that its errors point at the key.
        return fields

    @classmethod
    def _parse_number(cls, number: int | float) -> dict[str, Any]:
        return {"count": _range(CountRange, number)}

    @classmethod
    def _user_schema(cls) -> dict[str, Any]:
        part = rf"{_COUNT_RANGE}|{_ARCH_PATTERN}"
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
            ]
        }

    def __str__(self) -> str:
        return f"{self.arch.value}:{self.count}" if self.arch else str(self.count)


# --- disk -----------------------------------------------------------------------------------


class DiskSpec(_Spec):
    """`disk:`: a size range (default `100GB..`); a memory range or `{size: range}`."""

    size: MemoryRange = MemoryRange(min=100.0)

    _what: ClassVar[str] = "disk spec"
    _forms: ClassVar[str] = "a size range such as 100GB.. or 200GB..1TB, or {size: range}"

    @classmethod
    def _parse_text(cls, text: str) -> dict[str, Any]:
        return {"size": _range(MemoryRange, text)}

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> dict[str, Any]:
        # An empty mapping is the object form with every default, not an empty range.
        if "size" in mapping or not mapping:
            _check_keys(cls._what, mapping, ("size",))
            return mapping
        return {"size": _range(MemoryRange, mapping)}

    @classmethod
    def _parse_number(cls, number: int | float) -> dict[str, Any]:
        return {"size": _range(MemoryRange, number)}

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


# --- GPU ------------------------------------------------------------------------------------


class GPUVendor(str, Enum):
    """GPU (accelerator) vendor."""

    NVIDIA = "nvidia"
    AMD = "amd"
    INTEL = "intel"
    GOOGLE = "google"
    TENSTORRENT = "tenstorrent"


_VENDOR_WORDS = {
    **{vendor.value: vendor for vendor in GPUVendor},
    "tpu": GPUVendor.GOOGLE,
    "tt": GPUVendor.TENSTORRENT,
}
_VENDOR_PATTERN = "|".join(_any_case(word) for word in _VENDOR_WORDS)

_GPU_TABLE = {
    GPUVendor.NVIDIA: """B300 B200 B100 GB200 GH200 H200 H200NVL H100 H100NVL H800 H20 A100
        A800 A40 A30 A10G A10 A16 A2 L40S L40 L4 T4 V100 P100 P40 P4 K80 RTX3090 RTX4090
        RTX5090 RTX6000 RTX6000Ada RTXPRO6000 RTXA4000 RTXA5000 RTXA6000 A4000 A5000 A6000""",
    GPUVendor.AMD: "MI355X MI350X MI325X MI300X MI300A MI250X MI250 MI210 MI100",
    GPUVendor.INTEL: "Gaudi Gaudi2 Gaudi3",
    GPUVendor.TENSTORRENT: "n150 n300 p100a p150a p150b p300c Galaxy",
}
KNOWN_GPUS: dict[str, tuple[str, GPUVendor]] = {
    name.lower(): (name, vendor) for vendor, names in _GPU_TABLE.items() for name in names.split()
}
"""Well-known GPU names (lower-cased) -> (canonical spelling, vendor).

Google TPUs are recognised by shape instead (`v` and a digit: `v5e`, `v5litepod-8`).
"""

_TPU_NAME_RE = re.compile(r"v\d[a-z0-9-]*", re.ASCII)
_GPU_NAME = r"[A-Za-z][A-Za-z0-9_+-]*"
_GPU_NAMES = rf"{_GPU_NAME}(?:\s*,\s*{_GPU_NAME})*"
_GPU_NAME_RE = re.compile(_GPU_NAME, re.ASCII)


def gpu_vendor_of(name: str) -> GPUVendor | None:
    """The vendor of a GPU name: from the table; `v<digit>...` is a Google TPU; else None."""
    lowered = name.lower()
    known = KNOWN_GPUS.get(lowered)
    if known is not None:
        return known[1]
    return GPUVendor.GOOGLE if _TPU_NAME_RE.fullmatch(lowered) else None


def infer_gpu_vendor(names: tuple[str, ...] | None) -> GPUVendor | None:
    """The vendor when every name is a known GPU of that one vendor, else None."""
    if not names:
        return None
    vendors = {gpu_vendor_of(name) for name in names}
    return vendors.pop() if len(vendors) == 1 else None


def _canonical_name(name: str) -> str:
    """The table's spelling of a known name; TPU names lower-case, without `tpu-`."""
    lowered = name.lower()
    known = KNOWN_GPUS.get(lowered)
    if known is not None:
        return known[0]
    if lowered.startswith("tpu-"):  # the deprecated way to say vendor google
        lowered = lowered[4:]
    return lowered if _TPU_NAME_RE.fullmatch(lowered) else name


def _parse_names(what: str, value: object) -> tuple[str, ...]:
    """Names from `A10G,A100` or a list; canonical spelling, duplicates dropped, order kept."""
    items: list[object]
    if isinstance(value, str):
        items = list(value.split(","))
    elif isinstance(value, (list, tuple)) and value:
        items = list(value)
    else:
        raise ValueError(f"invalid {what}: name {describe(value)} is not a name or list of names")
    names: list[str] = []
    for item in items:
        text = item.strip() if isinstance(item, str) else ""
        if len(text) > 64 or not _GPU_NAME_RE.fullmatch(text):
            raise ValueError(
                f"invalid {what}: {describe(item)} is not a GPU name (a letter, then letters, "
                "digits, '-', '_' or '+', e.g. A100, v5litepod-8)"
            )
        if text.lower() in _VENDOR_WORDS:
            # In the shorthand a vendor word is always the vendor, so it cannot be a name.
            raise ValueError(f"invalid {what}: {text!r} is a vendor, not a GPU name")
        name = _canonical_name(text)
        if name not in names:
            names.append(name)
    return tuple(names)


def _parse_vendor(what: str, value: object) -> GPUVendor:
    if isinstance(value, GPUVendor):
        return value
    vendor = _VENDOR_WORDS.get(value.strip().lower()) if isinstance(value, str) else None
    if vendor is None:
        raise ValueError(
            f"invalid {what}: unknown GPU vendor {describe(value)}; expected nvidia, amd, "
            "intel, google (or tpu) or tenstorrent (or tt)"
        )
    return vendor


def _resolve_vendor(
    what: str, vendor: GPUVendor | None, names: tuple[str, ...] | None
) -> GPUVendor | None:
    """Check an explicit vendor against known names, or infer it from them."""
    if vendor is None:
        return infer_gpu_vendor(names)
    for name in names or ():
        other = gpu_vendor_of(name)
        if other is not None and other is not vendor:
            raise ValueError(
                f"invalid {what}: {name} is made by {other.value}, "
                f"but vendor {vendor.value} was given"
            )
    return vendor


_CC_RE = re.compile(r"\s*(\d{1,3})(?:\.(\d{1,3}))?\s*", re.ASCII)


def _parse_compute_capability(value: object) -> tuple[int, int]:
    """A minimum CUDA compute capability from `7.5`, `"7.5"`, `8` or `[7, 5]`."""
    match = None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1000:
        match = _CC_RE.fullmatch(str(value))
    elif isinstance(value, str) and len(value) <= 20:
        match = _CC_RE.fullmatch(value)
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        if all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1000 for v in value):
            return value[0], value[1]
    if match is None:
        raise ValueError(
            f"invalid gpu spec: compute_capability {describe(value)} is not a version such "
            "as 7.5 or 8.0"
        )
    return int(match[1]), int(match[2] or 0)


class GPUSpec(_Spec):
    """`gpu:`: vendor, names (any of), per-GPU memory, count, total memory, compute capability.

    A spec given without a count means `1..`; `ResourcesSpec` defaults to `0..` (any number,
    including none). The vendor is inferred when all names are known GPUs of one vendor.
    Serialises to the shorthand `[vendor:]names:memory:count`, or to the object form when
    `total_memory` or `compute_capability` (which the shorthand cannot express) are set.
    """

    vendor: GPUVendor | None = None
    name: tuple[str, ...] | None = None
    count: CountRange = CountRange(min=1)
    memory: MemoryRange | None = None
    total_memory: MemoryRange | None = None
    compute_capability: tuple[int, int] | None = None

    _what: ClassVar[str] = "gpu spec"
    _forms: ClassVar[str] = (
        "parts separated by ':' in any order: a vendor (nvidia, amd, intel, google/tpu, "
        "tenstorrent/tt), GPU names (A100 or A10G,A100), a memory range (24GB..) and a count "
        "range (2, 1..8), e.g. A100:80GB:2, 24GB..:1..8, nvidia:4; or an integer count; or "
        "{vendor, name, count, memory, total_memory, compute_capability}"
    )

    @classmethod
    def _parse_text(cls, text: str) -> dict[str, Any]:
        what = f"gpu spec {describe(text)}"
        fields: dict[str, Any] = {}
        seen: dict[str, str] = {}
        for part in _split_parts(what, cls._forms, text, max_parts=4):
            # The classification order is dstack's: vendor, name, memory, count.
            vendor = _VENDOR_WORDS.get(part.lower())
            if vendor is not None:
                key, parsed = "vendor", vendor
            elif part[0].isascii() and part[0].isalpha():
                key, parsed = "name", _parse_names(what, part)
            elif any(c.isalpha() for c in part):
                key, parsed = "memory", _range(MemoryRange, part, what)
            else:
                key, parsed = "count", _range(CountRange, part, what)
            if key in seen:
                raise ValueError(f"invalid {what}: {key} given twice ({seen[key]} and {part})")
            fields[key], seen[key] = parsed, part
        fields["vendor"] = _resolve_vendor(what, fields.get("vendor"), fields.get("name"))
        return fields

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> dict[str, Any]:
        what = cls._what
        _check_keys(what, mapping, tuple(cls.model_fields))
        fields = dict(mapping)
        if fields.get("vendor") is not None:
            fields["vendor"] = _parse_vendor(what, fields["vendor"])
        if fields.get("name") is not None:
            fields["name"] = _parse_names(what, fields["name"])
        if fields.get("compute_capability") is not None:
            fields["compute_capability"] = _parse_compute_capability(fields["compute_capability"])
        fields["vendor"] = _resolve_vendor(what, fields.get("vendor"), fields.get("name"))
        # count, memory and total_memory are left to pydantic so errors point at their keys.
        return fields

    @classmethod
    def _parse_number(cls, number: int | float) -> dict[str, Any]:
        return {"count": _range(CountRange, number)}

    @classmethod
    def _user_schema(cls) -> dict[str, Any]:
        part = rf"{_GPU_NAMES}|{_MEMORY_RANGE}|{_COUNT_RANGE}"
        memory = MemoryRange.model_json_schema()
        cc = {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": anchored(r"\d+(?:\.\d+)?")},
                {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0},
                    "minItems": 2,
                    "maxItems": 2,
                },
            ]
        }
        name = {"type": "string", "pattern": anchored(_GPU_NAME)}
        mapping = {
            "type": "object",
            "properties": {
                "vendor": {"type": "string", "pattern": anchored(_VENDOR_PATTERN)},
                "name": {
                    "anyOf": [
                        {"type": "string", "pattern": anchored(_GPU_NAMES)},
                        {"type": "array", "items": name, "minItems": 1},
                    ]
                },
                "count": CountRange.model_json_schema(),
                "memory": memory,
                "total_memory": memory,
                "compute_capability": cc,
            },
            "additionalProperties": False,
        }
        return {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": anchored(rf"(?:{part})(?:\s*:\s*(?:{part}))*")},
                mapping,
            ]
        }

    @model_serializer(mode="plain")
    def _serialize(self) -> Any:
        if self.total_memory is None and self.compute_capability is None:
            return printed(self)  # the shorthand, as str() prints it without the extras
        data: dict[str, Any] = {}
        if self.vendor is not None:
            data["vendor"] = self.vendor.value
        if self.name is not None:
            data["name"] = list(self.name)
        data["count"] = str(self.count)
        for key, value in (("memory", self.memory), ("total_memory", self.total_memory)):
            if value is not None:
                data[key] = str(value)
        if self.compute_capability is not None:
            data["compute_capability"] = "{}.{}".format(*self.compute_capability)
        return data

    def shorthand(self) -> str:
        """`[vendor:]names:memory:count` with only the parts that are not implied.

        The vendor is left out when the names imply it, the count when it is `1..` (unless
        nothing else is printed); `total_memory` and `compute_capability` have no shorthand.
        """
        parts: list[str] = []
        if self.vendor is not None and self.vendor is not infer_gpu_vendor(self.name):
            parts.append(self.vendor.value)
        if self.name:
            parts.append(",".join(self.name))
        if self.memory is not None:
            parts.append(str(self.memory))
        if self.count != _DEFAULT_GPU_COUNT or not parts:
            parts.append(str(self.count))
        return ":".join(parts)

    def __str__(self) -> str:
        extra = []
        if self.total_memory is not None:
            extra.append(f"total_memory={self.total_memory}")
        if self.compute_capability is not None:
            extra.append("compute_capability={}.{}".format(*self.compute_capability))
        return " ".join([self.shorthand(), *extra])


_DEFAULT_GPU_COUNT = CountRange(min=1)


# --- resources ------------------------------------------------------------------------------


class ResourcesSpec(BaseModel):
    """`resources:`, each field accepting its shorthand; `str()` is the pretty one-liner."""

    model_config = _FROZEN

    cpu: CPUSpec = CPUSpec()
    memory: MemoryRange = MemoryRange(min=8.0)
    shm_size: Memory | None = None
    disk: DiskSpec = DiskSpec()
    gpu: GPUSpec = GPUSpec(count=CountRange(min=0))

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
