"""What a volume's state entry records: the provider's view of the volume it created; and
the typed spec of a volume's normalised config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.capabilities import Volume
from dstack_plan.state.model import ResourceState

if TYPE_CHECKING:
    from dstack_plan.config.volume import VolumeSpec


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


def volume_spec(after: dict[str, object]) -> VolumeSpec:
    """The typed spec of a volume's normalised config."""
    from dstack_plan.config.volume import VolumeSpec

    spec = spec_from_normalized("volume", dict(after))
    assert isinstance(spec, VolumeSpec)
    return spec
