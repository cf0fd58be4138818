"""The plan promises only what apply can do, through the CLI with a real local agent:
unsupported providers are refused at plan time, and crashed services are shown as failed and
planned again."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.unit.test_plan_honesty import SSH_PROJECT


def test_plan_and_apply_refuse_what_no_provider_can_create(dstack: Dstack, tmp_path) -> None:
    project = tmp_path / "project"
    (project / "infra.dstack.yml").write_text(SSH_PROJECT)
    for command in (("plan", "--detailed-exitcode"), ("apply", "-y")):
        result = dstack(*command)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert "will be created" not in result.stdout
        for line in (
            "3 resources cannot be applied by this version of dstack-plan:",
            "fleet.cloud: a cloud backend is not configured in .dstack/backends.yml",
            "volume.data: aws: not configured in .dstack/backends.yml (dstack init --backend aws)",
        ):
            assert line in result.stderr, result.stderr
        assert "task.train" not in result.stderr  # runs on SSH fleets are supported
    path = project / ".dstack" / "state.json"
    assert not path.exists() or state(project)["resources"] == {}


def service(name: str, commands: str, replicas: int = 1, image: str | None = None) -> str:
    where = f"image: {image}\n" if image else ""
    return (
        f"type: service\nname: {name}\nport: 18941\nreplicas: {replicas}\n{where}"
        f"commands: {commands}\nstop_duration: 1s\n{RESOURCES}"
    )


def test_a_crashed_service_is_failed_and_the_next_plan_starts_it_again(
    dstack: Dstack, tmp_path
) -> None:
    (tmp_path / "project" / "svc.dstack.yml").write_text(
        service("web", "['echo starting', 'exit 3']")
    )
    assert dstack("apply", "-y").returncode == 0
    row = wait_for_status(dstack, "service.web", {"failed"})
    assert row["failure"] == "container_exited_with_error: exited with code 3"
    first = state(tmp_path / "project")["resources"]["service.web"]["attributes"]["jobs"]

    drift = dstack("plan", "--detailed-exitcode")
    assert drift.returncode == 2, drift.stdout + drift.stderr
    assert "drift: service crashed (job web-0-0 exited with code 3)" in drift.stdout
    assert "Plan: 1 to add, 0 to change, 1 to destroy." in drift.stdout

    again = dstack("apply", "-y")
    assert again.returncode == 0, again.stdout + again.stderr
    wait_for_status(dstack, "service.web", {"failed"})
    second = state(tmp_path / "project")["resources"]["service.web"]["attributes"]["jobs"]
    assert [j["id"] for j in second] != [j["id"] for j in first]  # a new job ran
    assert dstack("destroy", "-y").returncode == 0


@pytest.mark.docker
def test_a_failed_replica_fails_its_service_in_ps_and_plan(
    dstack: Dstack, tmp_path, docker_client
) -> None:
    from tests.infra.docker_images import ensure_busybox_image

    # two replicas of one port share a host only as containers (each gets its own host port)
    image = ensure_busybox_image(docker_client)
    crash_second = "['if [ \"$DSTACK_REPLICA_NUM\" = 1 ]; then exit 4; fi', 'exec sleep 300']"
    (tmp_path / "project" / "svc.dstack.yml").write_text(service("api", crash_second, 2, image))
    assert dstack("apply", "-y").returncode == 0
    row = wait_for_status(dstack, "service.api", {"failed"})
    assert sorted(j["status"] for j in row["jobs"]) == ["failed", "running"]
    listed = dstack("ps")
    assert "service.api" in listed.stdout and "failed" in listed.stdout
    assert "exited (4)" in listed.stdout, listed.stdout

    drift = dstack("plan", "--detailed-exitcode")
    assert drift.returncode == 2, drift.stdout + drift.stderr
    assert "drift: service crashed (job api-1-0 exited with code 4)" in drift.stdout

    # the user stops what is left: it stays stopped, no drift
    stopped = dstack("stop", "api", "-y")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    quiet = dstack("plan", "--detailed-exitcode")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert dstack("destroy", "-y").returncode == 0
