"""`dstack offer` with a cloud backend configured: AWS offers from the shipped catalogue, in
the regions EC2 (moto server, through boto3's own `AWS_ENDPOINT_URL`) says offer them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI
from tests.infra.moto_server import CREDENTIALS

BACKENDS = "backends:\n  - type: aws\n    regions: [us-east-1, eu-west-1]\n"


@pytest.fixture
def cloud_project(tmp_path: Path, cli_env: dict[str, str], moto_server) -> tuple[Path, dict]:  # type: ignore[no-untyped-def]
    project = tmp_path / "project"
    (project / ".dstack").mkdir(parents=True)
    env = {**cli_env, **CREDENTIALS, "AWS_ENDPOINT_URL": moto_server.endpoint_url}
    return project, env


def offer(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "offer", *args], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )


def test_aws_offers_for_an_a100_are_p4_class_cheapest_first(
    cloud_project: tuple[Path, dict[str, str]],
) -> None:
    project, env = cloud_project
    (project / ".dstack" / "backends.yml").write_text(BACKENDS)
    result = offer(project, env, "--backend", "aws", "--gpu", "A100", "--json")
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)
    rows = view["offers"]
    assert rows, view
    assert {r["provider"] for r in rows} == {"aws"}  # --backend: no fleet hosts
    assert {r["host"].removesuffix(" (spot)") for r in rows} <= {"p4d.24xlarge", "p4de.24xlarge"}
    assert {r["region"] for r in rows} <= {"us-east-1", "eu-west-1"}
    prices = [r["price_per_hour"] for r in rows]
    assert prices == sorted(prices)
    assert any(r["host"].endswith("(spot)") for r in rows)
    assert all(len(r["gpus"]) == 8 and "A100" in r["gpus"][0]["name"] for r in rows)

    table = offer(project, env, "--backend", "aws", "--gpu", "A100")
    assert table.returncode == 0, table.stderr
    first = next(line for line in table.stdout.splitlines() if line.lstrip().startswith("1 "))
    assert "aws us-east-1" in first and "p4d.24xlarge" in first, table.stdout


def test_backends_this_version_cannot_use_are_notes_and_a_bad_file_is_located(
    cloud_project: tuple[Path, dict[str, str]],
) -> None:
    project, env = cloud_project
    view = json.loads(offer(project, env, "--backend", "aws", "--json").stdout)
    assert view["offers"] == []
    assert view["notes"] == [
        "aws: not configured in .dstack/backends.yml (dstack init --backend aws)"
    ]
    (project / ".dstack" / "backends.yml").write_text(
        BACKENDS + "  - type: gcp\n    project_id: p1\n"
    )
    view = json.loads(offer(project, env, "--gpu", "H100", "--json").stdout)
    # no GCP credentials here: a note, while AWS still answers
    assert view["notes"] == [
        "gcp: could not list offers: no GCP credentials found (credentials_file or "
        "application default ones)"
    ]
    assert any(r["host"].startswith("p5.48xlarge") for r in view["offers"])

    (project / ".dstack" / "backends.yml").write_text(BACKENDS + "    regoins: [x]\n")
    bad = offer(project, env, "--backend", "aws")
    assert bad.returncode == 1
    assert bad.stderr.startswith(".dstack/backends.yml:4:5: error:"), bad.stderr
    assert "Traceback" not in bad.stderr
    (project / ".dstack" / "backends.yml").write_text(BACKENDS)
    unknown = offer(project, env, "--backend", "nope")
    assert unknown.returncode == 1 and "no such backend" in unknown.stderr, unknown.stderr
