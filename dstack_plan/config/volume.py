"""`type: volume` — network disks that runs mount."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationInfo, field_validator, model_validator

from dstack_plan.config.base import FieldConflict, ResourceSpec, is_stored
from dstack_plan.config.units import IdleDuration, Memory


class VolumeSpec(ResourceSpec):
    type: Literal["volume"] = "volume"
    backend: Literal["aws", "gcp", "azure", "runpod", "kubernetes", "local"]
    region: str | None = None
    availability_zone: str | None = None
    size: Memory | None = None
    volume_id: str | None = None
    """Register an existing disk: it is never deleted physically."""
    auto_cleanup_duration: IdleDuration | None = None
    tags: dict[str, str] | None = None
    claim_name: str | None = None
    storage_class_name: str | None = None
    access_modes: tuple[str, ...] | None = None
    read_only: bool | None = None

    @property
    def provider(self) -> str:
        """The provider that holds it: its backend."""
        return self.backend

    @field_validator("size")
    @classmethod
    def _not_zero(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value == 0 and not is_stored(info):
            raise ValueError("volume size must be greater than 0GB")
        return value

    @model_validator(mode="after")
    def _shape(self) -> VolumeSpec:
        if self.backend == "kubernetes":
            if self.region is not None:
                raise FieldConflict("kubernetes volumes take no 'region'", "region")
        elif self.backend != "local" and self.region is None:
            raise FieldConflict(f"{self.backend} volumes need a 'region'", "backend")
        if self.size is None and self.volume_id is None and self.claim_name is None:
            raise ValueError(
                "a volume needs 'size' (to create one) or 'volume_id' (to register one)"
            )
        return self
