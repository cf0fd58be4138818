"""`registry_auth` reaches the agent resolved, as secrets: never in a repr, only on the wire."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.config.loader import load_text
from dstack_plan.config.runs import RunSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import DstackPlanError
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job

CONTEXT = JobContext("train", "run-id", 0, "abc123", 1, "127.0.0.1", ("127.0.0.1",))


def task(registry_auth: str) -> RunSpec:
    text = "type: task\nname: train\nimage: reg.example:5000/team/img:1\ncommands: ['true']\n"
    [resource], issues = load_text(text + registry_auth, "t.dstack.yml")
    assert not issues
    assert isinstance(resource.spec, RunSpec)
    return resource.spec


def build(spec: RunSpec, tmp_path: Path, **environ: str) -> dict[str, object]:
    secrets = SecretStore(tmp_path, environ=environ)
    job = build_job(spec, JobSlot(0, 0), CONTEXT, secrets, environ={"REG_USER": "robot"})
    assert "pull-pw" not in repr(job) and "pull-pw" not in str(job.model_dump())
    return job.to_wire()


def test_registry_credentials_resolve_secrets_and_env(tmp_path: Path) -> None:
    spec = task(
        "registry_auth:\n  username: ${{ env.REG_USER }}\n  password: ${{ secrets.REG_PW }}\n"
    )
    wire = build(spec, tmp_path, DSTACK_SECRET_REG_PW="pull-pw")
    assert wire["registry_auth"] == {"username": "robot", "password": "pull-pw"}
    assert spec.registry_auth is not None and "secrets.REG_PW" in spec.registry_auth.password


def test_a_job_without_registry_credentials_sends_none(tmp_path: Path) -> None:
    assert "registry_auth" not in build(task(""), tmp_path)  # agents before the field accept it


def test_a_missing_registry_secret_is_named(tmp_path: Path) -> None:
    spec = task("registry_auth: {username: u, password: '${{ secrets.NOPE }}'}\n")
    with pytest.raises(DstackPlanError, match="secret 'NOPE' is not set"):
        build(spec, tmp_path)
