"""What a volume's state entry records: the provider's view of the volume it created."""

from __future__ import annotations

from pydantic import ValidationError

from dstack_plan.providers.capabilities import Volume
from dstack_plan.state.model import ResourceState


def volume_of(entry: ResourceState) -> Volume | None:
    """The volume a `volume.*` state entry records; None before the provider gave an id."""
    if not entry.attributes.get("id"):
        return None
    try:  # watch keeps its own notes beside the provider's view (`unused_since`)
        return Volume.model_validate(
            {k: v for k, v in entry.attributes.items() if k in Volume.model_fields}
        )
    except ValidationError:
        return None
