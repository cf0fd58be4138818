"""What state records of a cloud fleet's machines, beside the host records every fleet has.

A cloud fleet's entry holds `instances` (one per machine the provider created: its id,
region, type, spot or not, price, address and SSH user), the project key's path its hosts
are reached with, and the fleet's `price_per_hour`. Once a machine has booted it is a
host like an SSH fleet's: its agent, facts and pinned host key are in `hosts`
(`fleet_records.FleetRecord`), and `cloud_ssh_config` is the `ssh_config` that reaches them,
so everything that works on SSH hosts (placement, logs, attach, watch) works on these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from dstack_plan.config.labels import ZONE
from dstack_plan.fleets.records import FleetRecord
from dstack_plan.providers.base import Instance, Offer
from dstack_plan.state.model import ResourceState

if TYPE_CHECKING:
    from dstack_plan.config.fleet import SSHConfig


class CloudInstance(BaseModel):
    """One machine a provider created for the fleet."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    """The provider's id (`i-0abc...`)."""
    provider: str
    name: str
    region: str
    zone: str | None = None
    """Its availability zone, once the provider said (the network volumes it may mount)."""
    instance_type: str
    spot: bool = False
    price_per_hour: float = 0.0
    hostname: str = ""
    """Where it is reached over SSH; empty until it has booted."""
    ssh_user: str = "ubuntu"
    """The user its image logs in as (the backend's `ssh_user`)."""
    status: str = "provisioning"
    idle_duration: int | Literal["off"] | None = None
    """How long it may stay idle before watch releases it (above `nodes.min`): set on a
    machine added for a run (the shorter of the fleet's and the run's); None: the fleet's."""
    idle_since: float | None = None
    """When watch first saw it with no job (epoch seconds); None while a job runs there."""

    @classmethod
    def created(cls, instance: Instance, offer: Offer, ssh_user: str) -> CloudInstance:
        return cls(
            id=instance.id,
            provider=instance.provider,
            name=instance.name,
            region=instance.region,
            zone=instance.zone,
            instance_type=offer.instance_type,
            spot=offer.spot,
            price_per_hour=offer.price_per_hour,
            hostname=instance.hostname,
            ssh_user=ssh_user,
            status=instance.status,
        )

    def as_instance(self, fleet: str) -> Instance:
        """The provider's view of it, to refresh or terminate."""
        return Instance(
            provider=self.provider,
            id=self.id,
            name=self.name,
            fleet=fleet,
            hostname=self.hostname,
            region=self.region,
            zone=self.zone,
            price_per_hour=self.price_per_hour,
        )

    def seen(self, now: Instance) -> CloudInstance:
        """This record with what the provider says of it now."""
        return self.model_copy(
            update={
                "hostname": now.hostname or self.hostname,
                "zone": now.zone or self.zone,
                "status": now.status,
            }
        )


class CloudFleetRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    instances: tuple[CloudInstance, ...] = ()
    identity_file: str = ""
    """The project key's path (`providers/project_key.py`); never the key itself."""

    @classmethod
    def of(cls, entry: ResourceState | None) -> CloudFleetRecord:
        """The record in a fleet entry's attributes; instances that do not read are left out."""
        if entry is None:
            return cls()
        attributes = entry.attributes
        instances = []
        listed = attributes.get("instances")
        for raw in listed if isinstance(listed, list) else []:
            try:
                instances.append(CloudInstance.model_validate(raw))
            except ValidationError:
                continue
        return cls(
            instances=tuple(instances),
            identity_file=str(attributes.get("identity_file") or ""),
        )

    @property
    def price_per_hour(self) -> float:
        return round(sum(i.price_per_hour for i in self.instances), 4)

    def with_instances(self, instances: Iterable[CloudInstance]) -> CloudFleetRecord:
        return self.model_copy(update={"instances": tuple(instances)})

    def to_attributes(self) -> dict[str, Any]:
        return {
            "instances": [i.model_dump(mode="json") for i in self.instances],
            "identity_file": self.identity_file,
            "price_per_hour": self.price_per_hour,
        }


def hosts_of(record: CloudFleetRecord, hosts: FleetRecord) -> FleetRecord:
    """The host records of the machines `record` still has."""
    names = {i.hostname for i in record.instances if i.hostname}
    kept = tuple(h for h in hosts.hosts if h.name in names)
    return hosts.model_copy(update={"hosts": kept}).with_bandwidth_of(hosts)


def cloud_host_labels(record: CloudFleetRecord) -> dict[str, dict[str, tuple[str, ...]]]:
    """The built-in labels of a cloud fleet's booted machines, by host name: `zone`."""
    return {i.hostname: {ZONE: (i.zone,)} for i in record.instances if i.hostname and i.zone}


def cloud_ssh_config(record: CloudFleetRecord) -> SSHConfig:
    """The `ssh_config` that reaches the booted machines of `record`, in creation order."""
    from dstack_plan.config.fleet import SSHConfig  # only projects with fleets load it

    return SSHConfig.model_validate(
        {
            "identity_file": record.identity_file or None,
            "hosts": [
                {"hostname": i.hostname, "user": i.ssh_user}
                for i in record.instances
                if i.hostname
            ],
        }
    )
