"""`dstack validate` and `dstack plan` on SSH fleets, as a user runs them: a host listed by
two fleets is refused by both; a missing identity file by `plan` only."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import Dstack

FLEET = "type: fleet\nname: {name}\nssh_config:\n  user: ubuntu\n{key}  hosts:\n    - {host}\n"


def test_two_fleets_sharing_a_host_fail_validate_located(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "a.dstack.yml").write_text(FLEET.format(name="gpu-a", key="", host="10.0.0.5"))
    (project / "b.dstack.yml").write_text(FLEET.format(name="gpu-b", key="", host="10.0.0.5"))
    result = dstack("validate")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "b.dstack.yml:6:7: error: host 10.0.0.5 port 22 is already in fleet.gpu-a "
        "(a.dstack.yml:6:7); a host belongs to one fleet"
    ]
    assert "Traceback" not in result.stderr


def test_a_missing_identity_file_fails_plan_but_not_validate(
    dstack: Dstack, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    key = f"  identity_file: {tmp_path / 'no_key'}\n"
    (project / "a.dstack.yml").write_text(FLEET.format(name="gpu-a", key=key, host="10.0.0.5"))
    validated = dstack("validate")
    assert validated.returncode == 0, validated.stdout + validated.stderr
    planned = dstack("plan")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert (
        f"a.dstack.yml:5:18: error: identity_file {tmp_path / 'no_key'}: no such file"
        in planned.stderr.splitlines()
    )
    assert "Traceback" not in planned.stderr
