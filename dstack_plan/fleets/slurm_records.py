"""What a Slurm fleet's state entry records: the cluster, its login node's pinned key, and its
partitions as they were last read.

A Slurm fleet (`backends: [slurm]`) is capacity on a cluster, not machines: there is nothing to
create or terminate. Its entry holds what a run needs to reach the cluster without the
backends file (a destroy after the file changed, another project reading this one's state):
the cluster's settings (no secret: an identity file's path, never a key) and the login node's
host key, pinned on first use.
"""

from __future__ import annotations

from dstack_plan.config.slurm_backend import SlurmCluster
from dstack_plan.fleets.engine_records import EngineFleetRecord
from dstack_plan.providers.slurm.partitions import Partition
from dstack_plan.state.identity_memo import IdentityMemo
from dstack_plan.state.model import ResourceState


class SlurmFleetRecord(EngineFleetRecord):
    """The attributes of a Slurm fleet's state entry."""

    cluster: SlurmCluster
    pins: dict[str, str] = {}
    """The login node's (and a jump host's) pinned host keys, by host name."""
    partitions: tuple[Partition, ...] = ()

    @classmethod
    def of(cls, entry: ResourceState) -> SlurmFleetRecord:
        """The record `entry` holds (read once per entry object)."""
        return _RECORDS.get_or_make(entry, lambda e: cls.model_validate(e.attributes))


_RECORDS: IdentityMemo[ResourceState, SlurmFleetRecord] = IdentityMemo()
