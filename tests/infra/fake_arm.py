"""A fake Azure Resource Manager for the real azure-mgmt-* clients, on loopback over HTTPS.

A generic resource store: PUT of any `/subscriptions/S/resourceGroups/RG/providers/NS/TYPE/NAME`
keeps the body (with `id`, `name` and `properties.provisioningState` added), GET returns it or
a 404 `ResourceNotFound`, GET of the collection path lists it, DELETE removes it. Resource types
Azure creates asynchronously (VMs, virtual networks, security groups) answer with an
`Azure-AsyncOperation` URL on this server whose status is `InProgress` once, then `Succeeded`
(or `Failed` with an injected error). A VM also brings what Azure makes of its inline network
configuration (a NIC with a private address, a public IP from `addresses`) and an OS disk, and
deleting it deletes them. Managed disks (`Microsoft.Compute/disks`) are created and deleted with
operations too; the `dataDisks` of a VM's PUT or PATCH attach and detach them (the disk's
`managedBy` names the VM), a disk attached elsewhere or missing is refused, and so is deleting
an attached disk; deleting a VM detaches its data disks. The Compute SKU list is the
catalogue's sizes in every region, less what a test removes from `skus`.

Serve it with `RestServer(app, tls=self_signed_cert(directory))`: the clients refuse bearer tokens
over plain HTTP. `GET /msi/token` is an App Service managed-identity endpoint, so that
`DefaultAzureCredential` works with environment variables only (`msi_env`); the instance
metadata token path answers as on a VM without an identity.
"""

from __future__ import annotations

import copy
import itertools
import re
import time
from pathlib import Path
from typing import Any, Literal

from tests.infra.rest_server import Reply, Request, RestApp

SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
TOKEN = "fake-arm-token"
LRO_TYPES = frozenset(
    {
        "microsoft.compute/virtualmachines",
        "microsoft.compute/disks",
        "microsoft.network/virtualnetworks",
        "microsoft.network/networksecuritygroups",
    }
)
_RG = re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)$", re.I)
_RES = re.compile(
    r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/([^/]+)/([^/]+)"
    r"(?:/([^/]+))?(/instanceview)?$",
    re.I,
)
_SKUS = re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/skus$", re.I)
_LOCATION = re.compile(r"location eq '([^']+)'", re.I)

Failure = tuple[int | Literal["lro"], str]
"""An HTTP status to answer a VM's (or disk's) PUT with, or "lro" to fail its operation; and
the code."""


def _catalogue_skus() -> dict[str, list[str]]:
    from dstack_plan.providers.catalog import load_catalog

    out: dict[str, list[str]] = {}
    for item in load_catalog("azure").items:
        for region in item.regions:
            out.setdefault(region, []).append(item.instance_type)
    return out


class FakeARM(RestApp):
    """ARM's answers for one subscription; every field is safe to change from a test."""

    def __init__(self) -> None:
        super().__init__()
        self.resources: dict[str, dict[str, Any]] = {}
        """By lower-cased ARM id: the stored JSON."""
        self.children: dict[str, list[str]] = {}
        """A VM's id: the ids of the NIC, public IP and disk that go with it."""
        self.operations: dict[str, dict[str, Any]] = {}
        self.power: dict[str, str] = {}
        """A VM's id: its power state (`running`, `deallocated`, ...)."""
        self.skus: dict[str, list[str]] = _catalogue_skus()
        """Region: the VM sizes the SKU list offers there."""
        self.restricted: dict[str, list[str]] = {}
        """Region: sizes listed with a `Location` restriction (not available there)."""
        self.fail_sizes: dict[str, Failure] = {}
        self.quota: dict[str, int] = {}
        """VM size: how many VMs of it may exist; one more is refused as over quota."""
        self.addresses: list[str] = []
        """Public addresses handed to VMs in order; 127.0.0.1 once empty."""
        self.disk_failure: Failure | None = None
        """What every disk PUT meets while set."""
        self.disk_quota: int | None = None
        """How many managed disks (OS disks aside) may exist; one more is refused as over
        quota."""
        self._ops = itertools.count(1)
        self._private = itertools.count(4)

    # -- test helpers

    def vms(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r for k, r in self.resources.items() if _type_of(k) in _VM]

    def disks(self) -> list[dict[str, Any]]:
        """The managed disks, OS disks aside."""
        with self.lock:
            return [r for k, r in self.resources.items() if _is_data_disk(k)]

    def vm_puts(self) -> list[dict[str, Any]]:
        """The bodies of every VM PUT, oldest first."""
        return [r.body for r in self.sent("PUT", "/virtualMachines/")]

    def set_power(self, vm_name: str, state: str | None) -> None:
        """Give a VM a power state (`deallocated`, `stopped`, ...); None removes it (evicted)."""
        with self.lock:
            key = next(k for k, r in self.resources.items() if _is_vm(k, r, vm_name))
            if state is None:
                self._delete(key)
            else:
                self.power[key] = state

    # -- dispatch

    def handle(self, request: Request) -> Reply:
        path = request.path.rstrip("/")
        if path == "/msi/token":
            return self._token(request)
        if path == "/metadata/identity/oauth2/token":  # IMDS of a VM without an identity
            return Reply(
                400, {"error": "invalid_request", "error_description": "Identity not found"}
            )
        if path.startswith("/operations/"):
            return self._operation(path.rsplit("/", 1)[1])
        if _SKUS.match(path):
            return self._skus(request)
        if m := _RG.match(path):
            return self._group(request, m.group(2))
        if m := _RES.match(path):
            if m.group(5) is None:
                return self._collection(request, path)
            return self._resource(request, path, m.group(2), bool(m.group(6)))
        return _error(404, "InvalidResourceType", f"no route for {request.method} {path}")

    def _token(self, request: Request) -> Reply:
        if not request.headers.get("X-IDENTITY-HEADER"):
            return Reply(400, {"error": "invalid_request", "error_description": "no header"})
        resource = request.query.get("resource", [""])[0]
        expires = int(time.time()) + 3600
        body = {
            "access_token": TOKEN,
            "expires_on": str(expires),
            "resource": resource,
            "token_type": "Bearer",
        }
        return Reply(200, body)

    def _skus(self, request: Request) -> Reply:
        wanted = _LOCATION.search(request.query.get("$filter", [""])[0])
        regions = [wanted.group(1)] if wanted else sorted(self.skus)
        value = []
        for region in regions:
            for size in self.skus.get(region, []):
                value.append(_sku(size, region, []))
            for size in self.restricted.get(region, []):
                restriction = {
                    "type": "Location",
                    "values": [region],
                    "reasonCode": "NotAvailableForSubscription",
                }
                value.append(_sku(size, region, [restriction]))
        return Reply(200, {"value": value})

    def _operation(self, op_id: str) -> Reply:
        op = self.operations.get(op_id)
        if op is None:
            return _error(404, "NotFound", "no such operation")
        op["polls"] += 1
        if op["polls"] == 1 and not op["done"]:
            return Reply(200, {"status": "InProgress"}, _retry())
        res = self.resources.get(op["resource"])
        if op["error"] is not None:
            if res is not None:
                res["properties"]["provisioningState"] = "Failed"
            body = {"status": "Failed", "error": {"code": op["error"], "message": "injected"}}
            return Reply(200, body)
        if res is not None:
            res["properties"]["provisioningState"] = "Succeeded"
            if _type_of(op["resource"]) in _VM:
                self.power.setdefault(op["resource"], "running")
        return Reply(200, {"status": "Succeeded"})

    # -- resource groups

    def _group(self, request: Request, name: str) -> Reply:
        key = request.path.lower().rstrip("/")
        if request.method == "PUT":
            created = key not in self.resources
            body = dict(request.body or {})
            body.update(id=request.path, name=name, type="Microsoft.Resources/resourceGroups")
            body["properties"] = {"provisioningState": "Succeeded"}
            self.resources[key] = body
            return Reply(201 if created else 200, body)
        if key not in self.resources:
            return _error(404, "ResourceGroupNotFound", f"Resource group '{name}' not found.")
        if request.method == "DELETE":
            for k in [k for k in self.resources if k.startswith(key + "/")]:
                self._delete(k)
            del self.resources[key]
            return Reply(200)
        return Reply(200, self.resources[key])

    def _group_of(self, path: str) -> str:
        return "/".join(path.lower().split("/")[:5])

    # -- resources

    def _collection(self, request: Request, path: str) -> Reply:
        if self._group_of(path) not in self.resources:
            return _error(404, "ResourceGroupNotFound", "Resource group not found.")
        prefix = path.lower() + "/"
        expand = request.query.get("$expand", [""])[0].lower() == "instanceview"
        value = []
        for key, res in self.resources.items():
            if key.startswith(prefix) and "/" not in key[len(prefix) :]:
                value.append(self._with_view(key, res) if expand else res)
        return Reply(200, {"value": value})

    def _resource(self, request: Request, path: str, group: str, view: bool) -> Reply:
        if self._group_of(path) not in self.resources:
            return _error(404, "ResourceGroupNotFound", f"Resource group '{group}' not found.")
        key = path.lower().removesuffix("/instanceview")
        if request.method == "PUT":
            return self._put(request, key)
        if request.method == "PATCH":
            return self._patch(request, key)
        if request.method == "DELETE":
            if key not in self.resources:
                return Reply(204)
            owner = self.resources[key].get("managedBy")
            if owner:
                return _error(409, "OperationNotAllowed", f"Disk is attached to VM {owner}.")
            self._delete(key)
            if _type_of(key) in LRO_TYPES:
                op = self._new_op(key, done=True)
                return Reply(202, None, {"Azure-AsyncOperation": op, "Location": op, **_retry()})
            return Reply(200)
        res = self.resources.get(key)
        if res is None:
            name = path.rsplit("/", 1)[1]
            return _error(404, "ResourceNotFound", f"The Resource '{name}' was not found.")
        if view:
            return Reply(200, self._view(key, res))
        if request.query.get("$expand", [""])[0].lower() == "instanceview":
            return Reply(200, self._with_view(key, res))
        return Reply(200, res)

    def _put(self, request: Request, key: str) -> Reply:
        body: dict[str, Any] = copy.deepcopy(request.body or {})  # the record stays as sent
        name = request.path.rstrip("/").rsplit("/", 1)[1]
        kind = _type_of(key)
        props = dict(body.get("properties") or {})
        size = props.get("hardwareProfile", {}).get("vmSize", "")
        status, code = self.fail_sizes.get(size, (None, "")) if kind in _VM else (None, "")
        if kind in _DISK:
            status, code = self.disk_failure or (None, "")
        if isinstance(status, int):
            return _error(status, code, f"injected {code} for {size or name}")
        if kind in _DISK and key not in self.resources and self.disk_quota is not None:
            if len(self.disks()) >= self.disk_quota:
                message = (
                    "Operation results in exceeding quota limits of Disks. Maximum allowed: "
                    f"{self.disk_quota}, Current in use: {len(self.disks())}."
                )
                return _error(409, "OperationNotAllowed", message)
        if kind in _VM and key not in self.resources and size in self.quota:
            used = sum(
                1 for v in self.vms() if v["properties"]["hardwareProfile"]["vmSize"] == size
            )
            if used >= self.quota[size]:
                message = (
                    "Operation could not be completed as it results in exceeding approved "
                    f"{size} Cores quota."
                )
                return _error(409, "OperationNotAllowed", message)
        created = key not in self.resources
        refused = self._check_data_disks(key, props) if kind in _VM else None
        if refused is not None:
            return refused
        _add_child_ids(request.path.rstrip("/"), props)
        state = "Creating" if created else "Updating"
        props["provisioningState"] = state if kind in LRO_TYPES else "Succeeded"
        if kind in _DISK:
            kept = self.resources.get(key, {})
            props["diskState"] = kept.get("properties", {}).get("diskState", "Unattached")
            if kept.get("managedBy"):
                body["managedBy"] = kept["managedBy"]
        body.update(id=request.path.rstrip("/"), name=name, properties=props)
        self.resources[key] = body
        if kind in _VM:
            if created:  # an update keeps the NICs, addresses and disk it has
                self._vm_side_effects(key, request.path.rstrip("/"), body)
            self._sync_data_disks(key, body)
        if kind not in LRO_TYPES:
            return Reply(201 if created else 200, body)
        op = self._new_op(key, error=code if status == "lro" else None)
        # a disk's PUT is accepted (202), as Azure and its SDK have it
        answer = 202 if kind in _DISK and created else 201 if created else 200
        return Reply(answer, body, {"Azure-AsyncOperation": op, **_retry()})

    def _patch(self, request: Request, key: str) -> Reply:
        """A merge patch of a VM (objects merge, lists are replaced), as its update."""
        res = self.resources.get(key)
        if res is None or _type_of(key) not in _VM:
            name = request.path.rstrip("/").rsplit("/", 1)[1]
            return _error(404, "ResourceNotFound", f"The Resource '{name}' was not found.")
        merged = copy.deepcopy(res)
        _merge(merged, request.body or {})
        refused = self._check_data_disks(key, merged["properties"])
        if refused is not None:
            return refused
        merged["properties"]["provisioningState"] = "Updating"
        self.resources[key] = merged
        self._sync_data_disks(key, merged)
        op = self._new_op(key)
        return Reply(200, merged, {"Azure-AsyncOperation": op, **_retry()})

    def _check_data_disks(self, vm_key: str, props: dict[str, Any]) -> Reply | None:
        """Azure's refusal of a VM's data disks: a missing disk, one attached to another VM,
        or two at one LUN."""
        luns: set[int] = set()
        for data_disk in props.get("storageProfile", {}).get("dataDisks", []):
            disk_id = str(data_disk.get("managedDisk", {}).get("id", ""))
            disk = self.resources.get(disk_id.lower())
            if disk is None:
                return _error(404, "NotFound", f"Disk {disk_id} not found.")
            owner = str(disk.get("managedBy") or "")
            if owner and owner.lower() != vm_key:
                message = f"Disk {disk['name']} is already attached to VM {owner}."
                return _error(409, "ConflictingUserInput", message)
            if data_disk.get("lun") in luns:
                return _error(400, "InvalidParameter", f"LUN {data_disk['lun']} is taken.")
            luns.add(data_disk.get("lun"))
        return None

    def _sync_data_disks(self, vm_key: str, vm: dict[str, Any]) -> None:
        """The disks' `managedBy` after a VM's update: its data disks' say this VM, those it
        no longer lists say nothing."""
        wanted = {
            str(d.get("managedDisk", {}).get("id", "")).lower()
            for d in vm["properties"].get("storageProfile", {}).get("dataDisks", [])
        }
        for key, disk in self.resources.items():
            if not _is_data_disk(key):
                continue
            if key in wanted:
                disk["managedBy"] = vm["id"]
                disk["properties"]["diskState"] = "Attached"
            elif str(disk.get("managedBy") or "").lower() == vm_key:
                disk.pop("managedBy", None)
                disk["properties"]["diskState"] = "Unattached"

    def _vm_side_effects(self, key: str, path: str, vm: dict[str, Any]) -> None:
        """What Azure makes of a VM's inline network configuration, and its OS disk."""
        group = "/".join(path.split("/")[:5])
        kids: list[str] = []
        profile = vm["properties"].get("networkProfile", {})
        for nic in profile.get("networkInterfaceConfigurations", []):
            ipconfigs = []
            for ipc in nic.get("properties", {}).get("ipConfigurations", []):
                ip_props: dict[str, Any] = {"privateIPAddress": f"10.0.0.{next(self._private)}"}
                pub = ipc.get("properties", {}).get("publicIPAddressConfiguration")
                if pub:
                    pid = f"{group}/providers/Microsoft.Network/publicIPAddresses/{pub['name']}"
                    address = self.addresses.pop(0) if self.addresses else "127.0.0.1"
                    self.resources[pid.lower()] = {
                        "id": pid,
                        "name": pub["name"],
                        "location": vm.get("location"),
                        "properties": {"ipAddress": address, "provisioningState": "Succeeded"},
                    }
                    kids.append(pid.lower())
                    ip_props["publicIPAddress"] = {"id": pid}
                ipconfigs.append({"name": ipc.get("name"), "properties": ip_props})
            nid = f"{group}/providers/Microsoft.Network/networkInterfaces/{nic['name']}"
            self.resources[nid.lower()] = {
                "id": nid,
                "name": nic["name"],
                "location": vm.get("location"),
                "properties": {"ipConfigurations": ipconfigs, "provisioningState": "Succeeded"},
            }
            kids.append(nid.lower())
        disk = f"{group}/providers/Microsoft.Compute/disks/{vm['name']}_OsDisk"
        self.resources[disk.lower()] = {"id": disk, "name": f"{vm['name']}_OsDisk"}
        kids.append(disk.lower())
        self.children[key] = kids

    def _delete(self, key: str) -> None:
        res = self.resources.pop(key, None)
        self.power.pop(key, None)
        for kid in self.children.pop(key, []):
            self.resources.pop(kid, None)
        if res is not None and _type_of(key) in _VM:  # its data disks stay, detached
            self._sync_data_disks(key, {"id": res["id"], "properties": {}})

    def _new_op(self, key: str, *, error: str | None = None, done: bool = False) -> str:
        op_id = str(next(self._ops))
        self.operations[op_id] = {"resource": key, "polls": 0, "error": error, "done": done}
        return f"{self.base_url}/operations/{op_id}"

    def _view(self, key: str, res: dict[str, Any]) -> dict[str, Any]:
        state = res["properties"].get("provisioningState", "Succeeded")
        statuses = [{"code": f"ProvisioningState/{state.lower()}"}]
        if key in self.power:
            statuses.append({"code": f"PowerState/{self.power[key]}"})
        return {"statuses": statuses}

    def _with_view(self, key: str, res: dict[str, Any]) -> dict[str, Any]:
        if _type_of(key) not in _VM:
            return res
        props = {**res["properties"], "instanceView": self._view(key, res)}
        return {**res, "properties": props}


_VM = frozenset({"microsoft.compute/virtualmachines"})
_DISK = frozenset({"microsoft.compute/disks"})


def _type_of(key: str) -> str:
    parts = key.split("/")
    return "/".join(parts[6:8]) if len(parts) >= 9 else ""


def _is_vm(key: str, res: dict[str, Any], name: str) -> bool:
    return _type_of(key) in _VM and res.get("name") == name


def _is_data_disk(key: str) -> bool:
    return _type_of(key) in _DISK and not key.endswith("_osdisk")


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for field, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(field), dict):
            _merge(into[field], value)
        else:
            into[field] = copy.deepcopy(value)


def _add_child_ids(parent: str, props: dict[str, Any]) -> None:
    """Give nested child resources (subnets, security rules) the ids ARM gives them."""
    for field, segment in (("subnets", "subnets"), ("securityRules", "securityRules")):
        for child in props.get(field) or []:
            if isinstance(child, dict) and child.get("name"):
                child.setdefault("id", f"{parent}/{segment}/{child['name']}")


def _sku(size: str, region: str, restrictions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "resourceType": "virtualMachines",
        "name": size,
        "tier": "Standard",
        "locations": [region],
        "restrictions": restrictions,
    }


def _retry() -> dict[str, str]:
    # azure-core reads `Retry-After: 0` as "no hint" and falls back to its 30 s polling
    # interval; a millisecond hint is honoured.
    return {"Retry-After-Ms": "1"}


def _error(status: int, code: str, message: str) -> Reply:
    return Reply(status, {"error": {"code": code, "message": message}})


AZURE_VARS = (  # the machine's own Azure setup, which must not answer tests
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_USERNAME",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "MSI_ENDPOINT",
    "MSI_SECRET",
)


def msi_env(app: FakeARM, cert: Path) -> dict[str, str]:
    """The environment under which `DefaultAzureCredential()` takes its token from `app`
    (App Service managed identity) and the clients trust its certificate."""
    return {
        "IDENTITY_ENDPOINT": f"{app.base_url}/msi/token",
        "IDENTITY_HEADER": "fake-identity-header",
        "REQUESTS_CA_BUNDLE": str(cert),
    }
