"""What every engine fleet's state entry records besides its cluster (Slurm's and
Kubernetes' records extend it: `fleets/slurm_records.py`, `fleets/kubernetes_records.py`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class EngineFleetRecord(BaseModel):
    """The attributes every engine fleet's state entry has."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    problem: str | None = None
    """Why the last look at the cluster failed (it did not answer); None when it answered."""

    @property
    def status(self) -> str:
        """`unreachable` while the cluster does not answer, else `active`."""
        return "unreachable" if self.problem else "active"

    def to_attributes(self) -> dict[str, Any]:
        """The entry's attributes (what differs from the defaults)."""
        return self.model_dump(mode="json", exclude_defaults=True)
