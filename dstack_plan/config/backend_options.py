"""`backend_options`: settings that apply only to offers from one backend."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo

from dstack_plan.config.base import ItemError, Strict, is_stored


class VastAIOptions(Strict):
    """Options for Vast.ai offers: dstack 0.22.5 has options for this backend only."""

    type: Literal["vastai"] = "vastai"
    offer_order: Literal["score", "price"] | None = None
    """`score` (highest first, the default) or `price` (cheapest first)."""
    min_reliability: float | None = Field(default=None, ge=0, le=1)
    min_score: int | None = Field(default=None, ge=0)


BackendOptions = VastAIOptions


def one_entry_per_backend(
    options: tuple[BackendOptions, ...] | None, info: ValidationInfo
) -> tuple[BackendOptions, ...] | None:
    """Refuse a second entry for a backend: which one would apply is anyone's guess."""
    seen: set[str] = set()
    for index, option in enumerate(options or ()):
        if option.type in seen and not is_stored(info):
            raise ItemError(
                f"backend_options has a second entry for backend {option.type!r}: "
                "merge them into one",
                (index, "type"),
            )
        seen.add(option.type)
    return options
