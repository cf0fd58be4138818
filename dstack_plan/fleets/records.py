"""What an SSH fleet's state entry records: the one place that writes and reads its hosts.

`FleetHandler` writes a `FleetRecord` after create, update and refresh; `dstack fleet` reads
it back with `FleetRecord.of`. Each host carries its host-key pin, so the next connection to
it checks the key it presents against the one first seen (`providers/ssh/pins.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dstack_plan.errors import ProviderError
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.providers.names import ENGINES, SSH

if TYPE_CHECKING:
    from dstack_plan.config.fleet import SSHConfig

from collections.abc import Collection
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.providers.base import MachineResources
from dstack_plan.scheduler.bandwidth import LinkMatrix
from dstack_plan.state.identity_memo import IdentityMemo
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
    refresh records it; `dstack watch` only from the third failed check in a row). Whether
    it is `busy` is not recorded: what shows it asks its agent (`fleets/host_status.py`)."""
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


class BandwidthLink(BaseModel):
    """One probed pair of hosts: `src` sent to `dst` for about a second (`dstack fleet
    probe`, or half a second when fleet apply probed it). Unknown (`bytes_per_second` None)
    when the probe failed, with why. A pair with no link was never probed: the gang choice
    estimates it (`scheduler/bandwidth.py`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    src: str
    dst: str
    bytes_per_second: float | None = None
    """What arrived, as the receiver measured it."""
    sent_bytes_per_second: float | None = None
    """As the sender measured it (until the receiver had read the last byte)."""
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    measured_at: datetime | None = None
    """When this pair was probed (a record merges probes of different times); None in records
    written before links had their own time: the record's `measured_at`."""

    @property
    def pair(self) -> tuple[str, str]:
        """The unordered pair, as a sorted tuple: links count as symmetric."""
        return (self.src, self.dst) if self.src < self.dst else (self.dst, self.src)


class BandwidthRecord(BaseModel):
    """The measured bandwidth between a fleet's hosts: at most one link per unordered pair,
    each probed at its own time. Often partial: fleet apply probes about one pair per host
    (`fleets/apply_probe.py`), `dstack fleet probe` every pair; both merge in (`merged`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    measured_at: datetime
    """When the last probe merged into this record ran."""
    seconds: float = 1.0
    """How long each pair of that last probe was asked to send."""
    links: tuple[BandwidthLink, ...] = ()

    def matrix(self) -> LinkMatrix:
        """(src, dst) -> bytes per second of every link measured (unknown ones left out, but
        listed in `LinkMatrix.unknown`): the input of `scheduler.bandwidth.best_gang`, and
        what `dstack watch` exports (the measured links only)."""
        return LinkMatrix(
            {
                (link.src, link.dst): link.bytes_per_second
                for link in self.links
                if link.bytes_per_second is not None
            },
            unknown=[(x.src, x.dst) for x in self.links if x.bytes_per_second is None],
        )

    def best_rates(self) -> dict[str, float]:
        """host -> its fastest measured link (bytes per second); a host with none is absent.
        Its NIC is at least that fast."""
        best: dict[str, float] = {}
        for link in self.links:
            rate = link.bytes_per_second
            if rate is None:
                continue
            for host in (link.src, link.dst):
                best[host] = max(rate, best.get(host, rate))
        return best

    def merged(self, newer: BandwidthRecord) -> BandwidthRecord:
        """This record with `newer`'s links: a pair probed again takes its newer link, in the
        old one's place, measured or not (a pair that stopped connecting must show as such);
        every other pair keeps its link. Each link carries its own `measured_at`; the record
        takes `newer`'s time and seconds."""
        links: dict[tuple[str, str], BandwidthLink] = {}
        for record in (self, newer):
            for link in record.links:
                when = link.measured_at or record.measured_at
                links[link.pair] = link.model_copy(update={"measured_at": when})
        return BandwidthRecord(
            measured_at=newer.measured_at, seconds=newer.seconds, links=tuple(links.values())
        )

    def among(self, hosts: Collection[str]) -> BandwidthRecord | None:
        """Only the links between `hosts` (the ones still in the fleet); None if none is."""
        kept = tuple(x for x in self.links if x.src in hosts and x.dst in hosts)
        return self.model_copy(update={"links": kept}) if kept else None


class FleetRecord(BaseModel):
    """All hosts of one SSH fleet, in the order its config lists them."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    hosts: tuple[HostRecord, ...] = ()
    bandwidth: BandwidthRecord | None = None
    """The last `dstack fleet probe` (None: never probed). Kept across refreshes and
    updates for the hosts that stay."""

    @classmethod
    def of(cls, entry: ResourceState) -> FleetRecord:
        """The record in `entry`'s attributes; hosts that do not read are left out. Parsed
        once per entry (entries are immutable): a watch tick asks for a fleet of a hundred
        hosts dozens of times."""
        return _PARSED.get_or_make(entry, cls._parse)

    @classmethod
    def _parse(cls, entry: ResourceState) -> FleetRecord:
        hosts = []
        listed = entry.attributes.get("hosts")
        for raw in listed if isinstance(listed, list) else []:
            try:
                hosts.append(HostRecord.model_validate(raw))
            except ValidationError:
                continue  # hand-edited or from another version: refresh fills it again
        bandwidth = None
        if isinstance(entry.attributes.get("bandwidth"), dict):
            try:
                bandwidth = BandwidthRecord.model_validate(entry.attributes["bandwidth"])
            except ValidationError:
                pass  # unreadable: as if never probed (`dstack fleet probe` measures again)
        return cls(hosts=tuple(hosts), bandwidth=bandwidth)

    def by_name(self) -> dict[str, HostRecord]:
        return {h.name: h for h in self.hosts}

    def pins(self) -> dict[str, str]:
        return {h.name: h.host_key for h in self.hosts if h.host_key}

    @property
    def status(self) -> str:
        """`active` when every host answered, else `degraded`."""
        return "degraded" if any(h.problem for h in self.hosts) else "active"

    def with_bandwidth_of(self, old: FleetRecord) -> FleetRecord:
        """This record with `old`'s measured bandwidth between the hosts this one has."""
        if old.bandwidth is None:
            return self
        kept = old.bandwidth.among({h.name for h in self.hosts})
        return self.model_copy(update={"bandwidth": kept})

    def to_attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {"hosts": [h.model_dump(mode="json") for h in self.hosts]}
        if self.bandwidth is not None:  # absent when never probed: older readers see nothing new
            attributes["bandwidth"] = self.bandwidth.model_dump(mode="json")
        return attributes


def host_labels(entry: ResourceState) -> dict[str, dict[str, tuple[str, ...]]]:
    """The labels each host of the SSH fleet `entry` records carries, by host name, as its
    applied configuration gives them (`hosts: [{hostname, labels}]`); a value given alone
    is a list of one. Relabelling a host updates the fleet in place: no host is touched."""
    from dstack_plan.config.fleet import FleetSpec  # only projects with fleets load it
    from dstack_plan.plan.normalize import spec_from_normalized

    spec = spec_from_normalized("fleet", dict(entry.spec))
    if not isinstance(spec, FleetSpec) or spec.ssh_config is None:
        return {}
    config = spec.ssh_config
    return {
        config.host_name(host): {
            key: (value,) if isinstance(value, str) else tuple(value)
            for key, value in host.labels.items()
        }
        for host in config.hosts
        if host.labels
    }


def is_cloud_fleet(entry: ResourceState) -> bool:
    """Whether a fleet entry's machines come from a cloud provider (it has `nodes`)."""
    return (
        entry.kind == "fleet"
        and not isinstance(entry.spec.get("ssh_config"), dict)
        and entry.provider not in ENGINES
    )


def is_engine_fleet(entry: ResourceState) -> bool:
    """Whether a fleet entry is capacity on a cluster whose own scheduler runs the jobs
    (Slurm: `fleets/slurm.py`)."""
    return entry.kind == "fleet" and entry.provider in ENGINES


def fleet_ssh_config(spec: Mapping[str, Any], address: str) -> tuple[str, SSHConfig]:
    """The fleet's name and the `ssh_config` its normalised `spec` holds."""
    from dstack_plan.config.fleet import FleetSpec  # only projects with fleets load it

    fleet = spec_from_normalized("fleet", dict(spec))
    assert isinstance(fleet, FleetSpec)
    if fleet.ssh_config is None:
        raise ProviderError(SSH, "the fleet has no ssh_config", address)
    return address.split(".", 1)[1], fleet.ssh_config


_PARSED: IdentityMemo[ResourceState, FleetRecord] = IdentityMemo()
"""`FleetRecord.of`'s parsed records, by entry."""
