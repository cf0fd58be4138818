"""What the Slurm and Kubernetes backends share about their `clusters:` lists: each cluster
has a name of its own, and a fleet names the cluster it uses (or takes the first)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from dstack_plan.config.base import ItemError


class _Named(Protocol):
    @property
    def name(self) -> str: ...


ClusterT = TypeVar("ClusterT", bound=_Named)


def unique_names(clusters: list[ClusterT]) -> list[ClusterT]:
    """`clusters` as they are; ItemError at the second cluster of a name."""
    seen: set[str] = set()
    for index, cluster in enumerate(clusters):
        if cluster.name in seen:
            raise ItemError(f"a second cluster named {cluster.name!r}", (index, "name"))
        seen.add(cluster.name)
    return clusters


def named(clusters: Sequence[ClusterT], name: str | None) -> ClusterT | None:
    """The cluster `name` (None: the first); None when there is no such cluster."""
    if name is None:
        return clusters[0]
    return next((c for c in clusters if c.name == name), None)
