"""What an SSH fleet's state entry records: the one place that writes and reads its hosts.

`FleetHandler` writes a `FleetRecord` after create, update and refresh; `dstack fleet` reads
it back with `FleetRecord.of`. Each host carries its host-key pin, so the next connection to
it checks the key it presents against the one first seen (`providers/ssh/pins.py`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.providers.base import MachineResources
from dstack_plan.state.model import ResourceState


class HostRecord(BaseModel):
    """One host of an SSH fleet as state remembers it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    """`hostname`, or `hostname:port` when the port is not 22 (how messages name it)."""
    hostname: str
    port: int = 22
    instance_id: str = ""
    status: str = "unknown"
    """`idle` when its agent answered, `unreachable` when the last attempt failed (as a
    refresh records it; `dstack watch` only from the third failed check in a row)."""
    resources: MachineResources | None = None
    agent_version: str | None = None
    agent_sha256: str | None = None
    agent_persistent: bool | None = None
    """The agent runs as an enabled systemd unit and comes back after a reboot (False: started
    detached, it does not; None: not known yet)."""
    host_key: str | None = None
    """The pinned host key (`<algorithm> <base64>`), recorded on first use."""
    host_key_fingerprint: str | None = None
    problem: str | None = None
    """Why the last create or refresh failed on this host."""
    failed_checks: int = 0
    """Consecutive ticks of `dstack watch` this host's agent did not answer in
    (`watch/reachability.py`): kept here so a restarted watch does not count from zero."""
    unreachable_since: float | None = None
    """When the first of those failed checks was (epoch seconds); the host is `unreachable`
    from the third one on, and its jobs fail after the grace period."""
    lost_jobs: tuple[str, ...] = ()
    """Jobs watch gave up here (`instance_unreachable`): stopped and removed once the host
    answers again, so none runs twice."""


class FleetRecord(BaseModel):
    """All hosts of one SSH fleet, in the order its config lists them."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    hosts: tuple[HostRecord, ...] = ()

    @classmethod
    def of(cls, entry: ResourceState) -> FleetRecord:
        """The record in `entry`'s attributes; hosts that do not read are left out."""
        hosts = []
        listed = entry.attributes.get("hosts")
        for raw in listed if isinstance(listed, list) else []:
            try:
                hosts.append(HostRecord.model_validate(raw))
            except ValidationError:
                continue  # hand-edited or from another version: refresh fills it again
        return cls(hosts=tuple(hosts))

    def by_name(self) -> dict[str, HostRecord]:
        return {h.name: h for h in self.hosts}

    def pins(self) -> dict[str, str]:
        return {h.name: h.host_key for h in self.hosts if h.host_key}

    @property
    def status(self) -> str:
        """`active` when every host answered, else `degraded`."""
        return "degraded" if any(h.problem for h in self.hosts) else "active"

    def to_attributes(self) -> dict[str, Any]:
        return {"hosts": [h.model_dump(mode="json") for h in self.hosts]}
