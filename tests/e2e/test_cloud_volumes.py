"""`type: volume` on AWS through the CLI: created as a tagged EBS volume, kept by destroy
while prevent_destroy holds, deleted when allowed; a registered one is never deleted.
moto's EC2 is reached through boto3's own `AWS_ENDPOINT_URL`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state
from tests.infra.moto_server import CREDENTIALS, REGION

pytestmark = pytest.mark.aws
VOLUME = f"type: volume\nname: data\nbackend: aws\nregion: {REGION}\n"


@pytest.fixture
def project(tmp_path: Path, cli_env: dict[str, str], moto_server: Any) -> Path:
    dot = tmp_path / "project" / ".dstack"
    dot.mkdir(parents=True)
    (dot / "backends.yml").write_text(f"backends:\n  - type: aws\n    regions: [{REGION}]\n")
    cli_env.update(CREDENTIALS)
    cli_env["AWS_ENDPOINT_URL"] = moto_server.endpoint_url
    return tmp_path / "project"


@pytest.fixture
def ec2(moto_server: Any) -> Any:
    import boto3

    return boto3.client("ec2", endpoint_url=moto_server.endpoint_url, region_name=REGION)


def _tagged(ec2: Any, project: Path) -> list[dict[str, Any]]:
    found = ec2.describe_volumes(
        Filters=[{"Name": "tag:dstack-plan:project", "Values": [project.name]}]
    )["Volumes"]
    return [v for v in found if v["State"] not in ("deleting", "deleted")]


def test_a_volume_is_created_kept_by_prevent_destroy_and_deleted_when_allowed(
    dstack: Dstack, project: Path, ec2: Any
) -> None:
    (project / "volume.dstack.yml").write_text(VOLUME + "size: 20GB\n")
    planned = dstack("plan")
    assert planned.returncode == 0, planned.stderr
    assert "volume.data will be created" in planned.stdout, planned.stdout
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (vol,) = _tagged(ec2, project)
    assert vol["Size"] == 20 and vol["AvailabilityZone"] == f"{REGION}a"
    entry = state(project)["resources"]["volume.data"]
    assert entry["status"] == "active" and entry["attributes"]["id"] == vol["VolumeId"]
    assert dstack("plan", "--detailed-exitcode").returncode == 0  # refresh agrees: no change

    refused = dstack("destroy", "-y")
    assert refused.returncode == 1
    assert "prevent_destroy" in refused.stderr and "Traceback" not in refused.stderr
    assert [v["VolumeId"] for v in _tagged(ec2, project)] == [vol["VolumeId"]]
    assert "volume.data" in state(project)["resources"]

    allowed = dstack("destroy", "-y", "--allow-destroy", "volume.data")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert _tagged(ec2, project) == []
    assert state(project)["resources"] == {}


def test_a_registered_volume_is_forgotten_not_deleted(
    dstack: Dstack, project: Path, ec2: Any
) -> None:
    made = ec2.create_volume(AvailabilityZone=f"{REGION}b", Size=8)["VolumeId"]
    (project / "volume.dstack.yml").write_text(
        VOLUME + f"volume_id: {made}\nlifecycle: {{prevent_destroy: false}}\n"
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    attrs = state(project)["resources"]["volume.data"]["attributes"]
    assert attrs["external"] is True and attrs["size_gb"] == 8
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert ec2.describe_volumes(VolumeIds=[made])["Volumes"][0]["State"] == "available"

    (project / "volume.dstack.yml").write_text(VOLUME + "volume_id: vol-00000000\n")
    missing = dstack("apply", "-y")
    assert missing.returncode == 1
    assert f"volume vol-00000000 not found in {REGION}" in missing.stdout + missing.stderr


def test_a_run_mounting_a_network_volume_off_its_backend_is_refused_by_the_plan(
    dstack: Dstack, project: Path
) -> None:
    (project / "volume.dstack.yml").write_text(VOLUME + "size: 20GB\n")
    (project / "task.dstack.yml").write_text(
        "type: task\nname: train\ncommands: [echo hi]\nvolumes: [data:/data]\n"
    )
    planned = dstack("plan")
    assert planned.returncode == 1
    assert (
        "task.train cannot run on any fleet: it mounts the aws volume data, which attaches "
        "only to aws machines, and fleet local is this machine"
    ) in planned.stderr, planned.stdout + planned.stderr
    assert "Traceback" not in planned.stderr


def test_watch_deletes_a_volume_unused_past_its_auto_cleanup_duration_only(
    dstack: Dstack, project: Path, ec2: Any
) -> None:
    (project / "volume.dstack.yml").write_text(
        VOLUME
        + "size: 8GB\nauto_cleanup_duration: 1s\n---\n"
        + VOLUME.replace("name: data", "name: kept")
        + "size: 8GB\n"
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    ids = {a: e["attributes"]["id"] for a, e in state(project)["resources"].items()}
    first = dstack("watch", "--once")  # first seen unused: noted, not deleted
    assert first.returncode == 0, first.stdout + first.stderr
    noted = state(project)["resources"]["volume.data"]["attributes"]
    assert isinstance(noted["unused_since"], float)
    assert "unused_since" not in state(project)["resources"]["volume.kept"]["attributes"]
    time.sleep(1.2)
    second = dstack("watch", "--once")
    assert second.returncode == 0, second.stdout + second.stderr
    left = {v["VolumeId"] for v in _tagged(ec2, project)}
    assert left == {ids["volume.kept"]}  # the one without a duration stays
    assert "cleaned_up_at" in state(project)["resources"]["volume.data"]["attributes"]
    planned = dstack("plan")  # it is gone: the next apply creates it again
    assert "volume.data" in planned.stdout and "created" in planned.stdout, planned.stdout
