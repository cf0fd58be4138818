"""GCP and Azure fleets from offer to a running job and back to nothing, through the `dstack`
CLI and the providers' real client libraries, against the local fakes of their APIs
(tests/infra/fake_gcp.py, tests/infra/fake_arm.py). The "booted" machine's address is a
namespace SSH host's (h2), which the fake API hands to the instance it creates.

The AWS path is tests/e2e/test_cloud_fleet.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_cloud_fleet import stop_agents
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_ssh_fleet import remote  # noqa: F401 - fixture
from tests.infra.fake_arm import AZURE_VARS, SUBSCRIPTION, FakeARM, msi_env
from tests.infra.fake_gcp import FakeGCP, service_account_file
from tests.infra.rest_server import RestServer, self_signed_cert
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh

FLEET = """\
type: fleet
name: cloud
nodes: 1
backends: [{backend}]
spot_policy: auto
resources: {{cpu: 4.., memory: 16GB..}}
"""
TASK = """\
type: task
name: where
fleets: [cloud]
commands: ["echo on $(hostname)"]
stop_duration: 1s
"""


def _project(project: Path, ssh_hosts: SSHTestHosts, backends_yml: str) -> Path:
    """`project` with `backends_yml` and the project key the namespace hosts accept."""
    dot = project / ".dstack"
    (dot / "ssh").mkdir(parents=True)
    (dot / "backends.yml").write_text(backends_yml)
    shutil.copy(ssh_hosts.client_key, dot / "ssh" / "id_ed25519")
    shutil.copy(f"{ssh_hosts.client_key}.pub", dot / "ssh" / "id_ed25519.pub")
    return project


def _offer_to_job_to_nothing(dstack: Dstack, project: Path, backend: str, h2: str) -> str:
    """Plan, apply, run a task on the machine, destroy; returns the instance type used."""
    (project / "fleet.dstack.yml").write_text(FLEET.format(backend=backend))
    planned = dstack("plan", "--json")
    assert planned.returncode == 0, planned.stderr
    offer = json.loads(planned.stdout)["resource_changes"][0]["placement"]["offer"]
    assert offer["provider"] == backend and offer["spot"] is True and offer["count"] == 1
    text = dstack("plan")
    assert f"1 × {offer['instance_type']} in {backend} {offer['region']} (spot)" in text.stdout

    applied = dstack("apply", "-y", timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    entry = state(project)["resources"]["fleet.cloud"]
    assert [i["hostname"] for i in entry["attributes"]["instances"]] == [h2]
    assert [h["name"] for h in entry["attributes"]["hosts"]] == [h2]

    (project / "task.dstack.yml").write_text(TASK)
    ran = dstack("apply", "-y", timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    wait_for_status(dstack, "task.where", {"done"}, timeout=60)
    assert dstack("logs", "where").stdout.strip() == "on h2"

    destroyed = dstack("destroy", "-y", timeout=300)
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert state(project)["resources"] == {}
    return str(offer["instance_type"])


def test_a_gcp_fleet_from_offer_to_a_running_job_and_back_to_nothing(
    dstack: Dstack,
    tmp_path: Path,
    gcp: FakeGCP,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    h2 = ssh_hosts["h2"].address
    gcp.addresses.append(h2)
    sa = service_account_file(tmp_path)
    project = _project(
        tmp_path / "project",
        ssh_hosts,
        "backends:\n  - type: gcp\n    project_id: proj-1\n    regions: [us-central1]\n"
        f"    credentials_file: {sa}\n    endpoint: {gcp.base_url}\n    ssh_user: root\n",
    )
    try:
        used = _offer_to_job_to_nothing(dstack, project, "gcp", h2)
    finally:
        stop_agents(remote)
    (inserted,) = gcp.inserted()
    assert inserted["machineType"].endswith(f"/machineTypes/{used}")
    assert inserted["scheduling"]["provisioningModel"] == "SPOT"
    assert inserted["labels"]["dstack-plan-project"] == "project"
    assert gcp.instances == {}  # destroy deleted it


def test_an_azure_fleet_from_offer_to_a_running_job_and_back_to_nothing(
    dstack: Dstack,
    tmp_path: Path,
    cli_env: dict[str, str],
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    cert = self_signed_cert(tmp_path)
    arm = FakeARM()
    server = RestServer(arm, tls=cert)
    h2 = ssh_hosts["h2"].address
    arm.addresses.append(h2)
    for name in AZURE_VARS:
        cli_env.pop(name, None)
    cli_env.update(msi_env(arm, cert[0]))  # DefaultAzureCredential: a managed identity
    project = _project(
        tmp_path / "project",
        ssh_hosts,
        f"backends:\n  - type: azure\n    subscription_id: {SUBSCRIPTION}\n"
        f"    regions: [eastus]\n    arm_endpoint: {arm.base_url}\n    ssh_user: root\n",
    )
    try:
        used = _offer_to_job_to_nothing(dstack, project, "azure", h2)
    finally:
        stop_agents(remote)
        server.stop()
    (put,) = [r for r in arm.sent("PUT", "/virtualMachines/")]
    assert put.body["properties"]["hardwareProfile"]["vmSize"] == used
    assert put.body["properties"]["priority"] == "Spot"
    assert put.body["tags"]["dstack-plan:project"] == "project"
    assert put.headers["Authorization"].startswith("Bearer ")
    assert arm.sent("DELETE", "/virtualMachines/")  # destroy deleted it
