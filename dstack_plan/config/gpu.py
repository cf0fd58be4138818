"""The `gpu:` spec: vendors, known GPU names, and the shorthand parsing and printing.

The share grammar (`25%`, part of one GPU) lives in `dstack_plan.config.gpu_share`.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, ClassVar

from pydantic import model_serializer, model_validator

from dstack_plan.config.gpu_share import (
    NO_TOTAL_MEMORY,
    ONE_GPU,
    SHARE_FRAGMENT,
    SHARE_HELP,
    SHARE_SCHEMA,
    check_one_gpu,
    format_share,
    fraction_schema,
    is_share_text,
    one_gpu,
    parse_share,
    share_fields,
)
from dstack_plan.config.ranges import CountRange, MemoryRange
from dstack_plan.config.spec_text import (
    COUNT_RANGE,
    MEMORY_RANGE,
    Spec,
    any_case,
    check_keys,
    parse_range,
    split_parts,
)
from dstack_plan.config.units import anchored, describe, printed

__all__ = ["KNOWN_GPUS", "GPUSpec", "GPUVendor", "gpu_vendor_of", "infer_gpu_vendor"]


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
_VENDOR_PATTERN = "|".join(any_case(word) for word in _VENDOR_WORDS)

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


class GPUSpec(Spec):
    """`gpu:`: vendor, names (any of), per-GPU memory, count, total memory, compute capability,
    and a share of one GPU (an extension).

    A spec given without a count means `1..`; `ResourcesSpec` defaults to `0..` (any number,
    including none). The vendor is inferred when all names are known GPUs of one vendor.
    Serialises to the shorthand `[vendor:]names:memory:count[:share]`, or to the object form
    when `total_memory` or `compute_capability` (which the shorthand cannot express) are set.
    """

    vendor: GPUVendor | None = None
    name: tuple[str, ...] | None = None
    count: CountRange = CountRange(min=1)
    memory: MemoryRange | None = None
    total_memory: MemoryRange | None = None
    compute_capability: tuple[int, int] | None = None
    share: int | None = None
    """Part of ONE GPU in thousandths, 1..999 (`25%` is 250); None asks for whole GPUs.

    Users write `25%` / `12.5%` (a shorthand part or `share:` value), a fraction below 1
    (`share: 0.25`, or a bare `gpu: 0.25`); the constructor takes those same forms, not the
    integer. With a share, `count` is exactly 1 (implied when not given) and `total_memory`
    is not allowed; vendor, names and `memory` still choose which GPU may be shared.
    """

    _what: ClassVar[str] = "gpu spec"
    _forms: ClassVar[str] = (
        "parts separated by ':' in any order: a vendor (nvidia, amd, intel, google/tpu, "
        "tenstorrent/tt), GPU names (A100 or A10G,A100), a memory range (24GB..), a count "
        "range (2, 1..8) and a share of one GPU (25%), e.g. A100:80GB:2, 24GB..:1..8, "
        "nvidia:4, A10G:25%; or an integer count; or a fraction of one GPU (0.25); or "
        "{vendor, name, count, memory, total_memory, compute_capability, share}"
    )

    @classmethod
    def _parse_text(cls, text: str) -> dict[str, Any]:
        what = f"gpu spec {describe(text)}"
        fields: dict[str, Any] = {}
        seen: dict[str, str] = {}
        for part in split_parts(what, cls._forms, text, max_parts=5):
            # The classification order is dstack's: vendor, name, memory, count; dstack
            # rejects a part ending in '%', so a share is told apart before all of them.
            vendor = _VENDOR_WORDS.get(part.lower())
            parsed: object
            if is_share_text(part):
                key, parsed = "share", parse_share(what, part)
            elif vendor is not None:
                key, parsed = "vendor", vendor
            elif part[0].isascii() and part[0].isalpha():
                key, parsed = "name", _parse_names(what, part)
            elif any(c.isalpha() for c in part):
                key, parsed = "memory", parse_range(MemoryRange, part, what)
            else:
                key, parsed = "count", parse_range(CountRange, part, what)
            if key in seen:
                raise ValueError(f"invalid {what}: {key} given twice ({seen[key]} and {part})")
            fields[key], seen[key] = parsed, part
        fields["vendor"] = _resolve_vendor(what, fields.get("vendor"), fields.get("name"))
        if "share" in fields:
            fields["count"] = one_gpu(what, fields.get("count"))
        return fields

    @classmethod
    def _parse_mapping(cls, mapping: dict[Any, Any]) -> dict[str, Any]:
        what = cls._what
        check_keys(what, mapping, tuple(cls.model_fields))
        fields = dict(mapping)
        if fields.get("vendor") is not None:
            fields["vendor"] = _parse_vendor(what, fields["vendor"])
        if fields.get("name") is not None:
            fields["name"] = _parse_names(what, fields["name"])
        if fields.get("compute_capability") is not None:
            fields["compute_capability"] = _parse_compute_capability(fields["compute_capability"])
        fields["vendor"] = _resolve_vendor(what, fields.get("vendor"), fields.get("name"))
        if fields.get("share") is not None:
            share_fields(what, fields)
        # count, memory and total_memory are left to pydantic so errors point at their keys.
        return fields

    @classmethod
    def _parse_number(cls, number: int | float) -> dict[str, Any]:
        # dstack refuses a fractional `gpu:`, so a fraction below 1 is free to mean a share.
        if isinstance(number, float) and not number.is_integer():
            if 0 < number < 1:
                return {"share": parse_share(cls._what, number), "count": ONE_GPU}
            raise ValueError(
                f"invalid count {describe(number)}: expected a non-negative integer (whole "
                f"GPUs) or a share; {SHARE_HELP}"
            )
        return super()._parse_number(number)

    @model_validator(mode="after")
    def _share_is_part_of_one_gpu(self) -> GPUSpec:
        # The parsers check this with the user's wording; this guards every other way in.
        if self.share is not None:
            check_one_gpu(self._what, self.count)
            if self.total_memory is not None:
                raise ValueError(NO_TOTAL_MEMORY)
        return self

    @classmethod
    def _user_schema(cls) -> dict[str, Any]:
        part = rf"{_GPU_NAMES}|{MEMORY_RANGE}|{COUNT_RANGE}|{SHARE_FRAGMENT}"
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
                "share": SHARE_SCHEMA,
            },
            "additionalProperties": False,
        }
        return {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                fraction_schema(),
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
        if self.share is not None:
            data["share"] = format_share(self.share)
        return data

    def shorthand(self) -> str:
        """`[vendor:]names:memory:count[:share]` with only the parts that are not implied.

        The vendor is left out when the names imply it, the count when it is `1..` (unless
        nothing else is printed) or a share implies it; the share comes last, as a percentage
        (`A10G:25%`); `total_memory` and `compute_capability` have no shorthand.
        """
        parts: list[str] = []
        if self.vendor is not None and self.vendor is not infer_gpu_vendor(self.name):
            parts.append(self.vendor.value)
        if self.name:
            parts.append(",".join(self.name))
        if self.memory is not None:
            parts.append(str(self.memory))
        if self.share is not None:
            parts.append(format_share(self.share))
        elif self.count != _DEFAULT_GPU_COUNT or not parts:
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
