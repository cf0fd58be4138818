"""A fake Compute Engine REST API for the real google-cloud-compute client (test-infra §2).

It serves what the `gcp` provider calls: machine types (aggregated), instances (insert /
get / list / aggregated / delete), firewalls, and zonal and global operations (`wait`).
State lives in memory; every request is recorded (`RestApp.requests`). Tests inject
refusals per machine type and zone, hand out the addresses "booted" instances get (a
namespace SSH host's, for end-to-end tests), and preempt spot instances.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.infra.rest_server import Reply, Request, RestApp

_ZONE_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/(.*)$")
_GLOBAL_PATH = re.compile(r"^/compute/v1/projects/([^/]+)/global/(.*)$")
_AGGREGATED = re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/(machineTypes|instances)$")


@dataclass
class Refusal:
    """How an insert of a machine type fails: at once over HTTP, or in its operation."""

    where: str
    """`http` (the insert call answers `status`) or `operation` (the operation ends with
    `code`)."""
    code: str
    status: int = 403
    message: str = "refused"


@dataclass
class FakeGCP(RestApp):
    """The fake API's state; `base_url` is set once served."""

    zones: dict[str, list[str]] = field(default_factory=dict)
    """zone → machine types it offers (default: every catalogue type in `<region>-a` and
    `<region>-b` of each catalogue region)."""
    refusals: dict[tuple[str, str | None], Refusal] = field(default_factory=dict)
    """(machine type, zone or None for every zone) → how its inserts fail."""
    addresses: list[str] = field(default_factory=list)
    """External addresses handed to new instances in order (then 127.0.0.1)."""
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    disks: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    firewalls: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        RestApp.__init__(self)
        self._ids = itertools.count(1)
        self._ips = itertools.count(10)
        if not self.zones:
            catalogue = json.loads(
                (Path(__file__).parents[2] / "dstack_plan/providers/catalog/gcp.json").read_text()
            )
            for item in catalogue["items"]:
                for region in item["regions"]:
                    for zone in (f"{region}-a", f"{region}-b"):
                        self.zones.setdefault(zone, []).append(item["instance_type"])

    # -- what tests call

    def preempt(self, name: str) -> None:
        """Reclaim a spot instance: with termination action DELETE it is simply gone."""
        with self.lock:
            for key in [k for k in self.instances if k[1] == name]:
                del self.instances[key]

    def inserted(self) -> list[dict[str, Any]]:
        """The instance bodies inserts sent, oldest first."""
        return [r.body for r in self.sent("POST") if r.path.endswith("/instances")]

    # -- serving

    def handle(self, request: Request) -> Reply:
        m = _AGGREGATED.match(request.path)
        if m and request.method == "GET":
            return self._aggregated(m.group(2))
        m = _ZONE_PATH.match(request.path)
        if m:
            return self._zonal(request, m.group(1), m.group(2), m.group(3))
        m = _GLOBAL_PATH.match(request.path)
        if m:
            return self._global(request, m.group(1), m.group(2))
        return _error(404, f"no route {request.method} {request.path}")

    def _url(self, project: str, rest: str) -> str:
        return f"{self.base_url}/compute/v1/projects/{project}/{rest}"

    def _operation(self, project: str, zone: str | None, errors: list[dict[str, str]]) -> Reply:
        name = f"operation-{next(self._ids)}"
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "name": name,
            "status": "RUNNING",  # done only when waited for: the client must wait
            "selfLink": self._url(project, f"zones/{zone}/operations/{name}" if zone else name),
        }
        if zone:
            op["zone"] = self._url(project, f"zones/{zone}")
        self.operations[name] = {
            **op,
            "status": "DONE",
            **({"error": {"errors": errors}} if errors else {}),
        }
        return Reply(body=op)

    def _get_operation(self, name: str) -> Reply:
        """An operation's GET or `wait`: done at once (with the refusal injected, if any)."""
        op = self.operations.get(name)
        return Reply(body=op) if op else _error(404, f"operation {name} not found")

    def _aggregated(self, kind: str) -> Reply:
        items: dict[str, Any] = {}
        if kind == "machineTypes":
            for zone, types in self.zones.items():
                items[f"zones/{zone}"] = {
                    "machineTypes": [{"name": t, "zone": zone} for t in types]
                }
        else:
            for (zone, _), inst in self.instances.items():
                items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(inst)
        return Reply(body={"items": items})

    def _zonal(self, request: Request, project: str, zone: str, rest: str) -> Reply:
        parts = rest.split("/")
        if parts[0] == "operations" and len(parts) >= 2:
            return self._get_operation(parts[1])
        if parts[0] == "disks":
            return self._disks(request, project, zone, parts[1:])
        if parts[0] != "instances":
            return _error(404, f"no route {rest}")
        if len(parts) == 1 and request.method == "POST":
            return self._insert(project, zone, request.body)
        if len(parts) == 1 and request.method == "GET":
            return Reply(body={"items": [i for (z, _), i in self.instances.items() if z == zone]})
        name = parts[1]
        inst = self.instances.get((zone, name))
        if inst is None:
            return _error(
                404,
                f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found",
            )
        if request.method == "DELETE":
            del self.instances[(zone, name)]
            for disk in self.disks.values():
                disk["users"] = [u for u in disk["users"] if not u.endswith(f"/instances/{name}")]
            return self._operation(project, zone, [])
        if len(parts) == 3 and parts[2] in ("attachDisk", "detachDisk"):
            return self._attachment(request, project, zone, inst, parts[2])
        return Reply(body=inst)

    def _disks(self, request: Request, project: str, zone: str, parts: list[str]) -> Reply:
        if not parts and request.method == "POST":
            disk = {
                **request.body,
                "status": "READY",
                "users": [],
                "zone": self._url(project, f"zones/{zone}"),
                "selfLink": self._url(project, f"zones/{zone}/disks/{request.body['name']}"),
            }
            self.disks[(zone, request.body["name"])] = disk
            return self._operation(project, zone, [])
        disk = self.disks.get((zone, parts[0])) if parts else None
        if disk is None:
            return _error(
                404, f"The resource 'projects/{project}/zones/{zone}/disks' was not found"
            )
        if request.method == "DELETE":
            if disk["users"]:
                return _error(400, f"The disk resource '{parts[0]}' is already being used")
            del self.disks[(zone, parts[0])]
            return self._operation(project, zone, [])
        return Reply(body=disk)

    def _attachment(
        self, request: Request, project: str, zone: str, inst: dict[str, Any], action: str
    ) -> Reply:
        user = self._url(project, f"zones/{zone}/instances/{inst['name']}")
        if action == "attachDisk":
            source = request.body["source"].rsplit("/", 1)[-1]
            disk = self.disks.get((zone, source))
            if disk is None:
                return _error(404, f"disk {source} not found")
            disk["users"].append(user)
            inst.setdefault("disks", []).append(
                {"source": disk["selfLink"], "deviceName": request.body["deviceName"]}
            )
            return self._operation(project, zone, [])
        device = request.query.get("deviceName", [""])[0]
        attached = [d for d in inst.get("disks", []) if d.get("deviceName") == device]
        if not attached:
            return _error(400, f"No attached disk found with device name '{device}'")
        inst["disks"].remove(attached[0])
        source = attached[0]["source"].rsplit("/", 1)[-1]
        disk = self.disks[(zone, source)]
        disk["users"] = [u for u in disk["users"] if u != user]
        return self._operation(project, zone, [])

    def _insert(self, project: str, zone: str, body: dict[str, Any]) -> Reply:
        machine_type = body["machineType"].rsplit("/", 1)[-1]
        if machine_type not in self.zones.get(zone, []):
            return _error(400, f"Invalid value for field 'resource.machineType': {machine_type}")
        refusal = self.refusals.get((machine_type, zone)) or self.refusals.get(
            (machine_type, None)
        )
        if refusal is not None and refusal.where == "http":
            return _error(refusal.status, refusal.message, reason=refusal.code)
        if refusal is not None:
            return self._operation(
                project, zone, [{"code": refusal.code, "message": refusal.message}]
            )
        inst = json.loads(json.dumps(body))
        nat = self.addresses.pop(0) if self.addresses else "127.0.0.1"
        for nic in inst.get("networkInterfaces", []):
            nic["networkIP"] = f"10.128.0.{next(self._ips)}"
            for access in nic.get("accessConfigs", []):
                access["natIP"] = nat
        inst.update(
            id=str(next(self._ids)),
            status="RUNNING",
            zone=self._url(project, f"zones/{zone}"),
            machineType=self._url(project, f"zones/{zone}/machineTypes/{machine_type}"),
        )
        self.instances[(zone, body["name"])] = inst
        return self._operation(project, zone, [])

    def _global(self, request: Request, project: str, rest: str) -> Reply:
        parts = rest.split("/")
        if parts[0] == "operations" and len(parts) >= 2:
            return self._get_operation(parts[1])
        if parts[0] != "firewalls":
            return _error(404, f"no route {rest}")
        if len(parts) == 1 and request.method == "POST":
            name = request.body["name"]
            if name in self.firewalls:
                return _error(409, f"The resource '{name}' already exists")
            self.firewalls[name] = request.body
            return self._operation(project, None, [])
        rule = self.firewalls.get(parts[1]) if len(parts) > 1 else None
        if rule is None:
            return _error(
                404, f"The resource 'projects/{project}/global/firewalls/{rest}' was not found"
            )
        return Reply(body=rule)


def _error(status: int, message: str, *, reason: str = "") -> Reply:
    error: dict[str, Any] = {"code": status, "message": message}
    if reason:
        error["errors"] = [{"reason": reason, "message": message}]
    return Reply(status, {"error": error})


def service_account_file(directory: Path) -> Path:
    """A service-account key file with a fresh RSA key. The client signs its own JWTs with
    it (self-signed JWT access), so its token endpoint is never called."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path = directory / "gcp-sa.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "proj-1",
                "private_key_id": "k1",
                "private_key": pem,
                "client_email": "dstack-plan@proj-1.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    return path
