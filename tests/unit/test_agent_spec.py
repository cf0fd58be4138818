"""Job spec validation: every bad field named with what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

from dstack_plan.agent.image_ref import image_reference_error
from dstack_plan.agent.spec import ENV_VALUE_MAX, SpecError, parse_job_spec


def problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as e:
        parse_job_spec(data)
    found: dict[str, str] = {}
    for field, message in e.value.problems:
        found[field] = f"{found[field]}; {message}" if field in found else message
    return found


def base(**kwargs: Any) -> dict[str, Any]:
    return {"run_name": "r", "commands": ["true"], **kwargs}


@pytest.mark.parametrize(
    "reference",
    [
        "busybox",
        "busybox:1.36",
        "library/ubuntu:22.04",
        "ghcr.io/org/image:tag",
        "localhost:5000/x/y",
        "127.0.0.1:9/nope/missing:1.0",
        "[::1]:5000/img",
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "repo@sha256:" + "a" * 64,
        "repo:tag@sha256:" + "b" * 64,
        "my-registry.example.com:443/a__b/c-d.e",
        "UPPER.example.com/lower",
    ],
)
def test_valid_image_references(reference: str) -> None:
    assert image_reference_error(reference) is None


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("busybox; rm -rf /", "whitespace"),
        ("busybox;reboot", "';'"),
        ("busybox$(reboot)", "'$'"),
        ("img`id`", "'`'"),
        ("a|b", "'|'"),
        ("", "must not be empty"),
        ("Ubuntu", "lowercase"),
        ("UPPER/x", "lowercase"),
        ("repo:", "not a valid image reference"),
        ("repo@sha256:123", "not a valid image reference"),
        ("-leading", "not a valid image reference"),
        ("a" * 300, "longer than 255"),
    ],
)
def test_invalid_image_references(reference: str, message: str) -> None:
    error = image_reference_error(reference)
    assert error is not None and message in error


def test_minimal_spec_gets_defaults_and_an_id() -> None:
    spec = parse_job_spec({"run_name": "r", "commands": ["echo hi"]})
    assert len(spec.id) == 36 and spec.network_mode == "host" and spec.stop_timeout == 10
    assert spec.gpu_count == 0 and spec.image is None


def test_full_spec_round_trips() -> None:
    data = {
        "id": "run-0-0-0",
        "run_name": "train",
        "run_id": "uuid-1",
        "image": "nvcr.io/nvidia/pytorch:24.01-py3",
        "commands": ["pip install -r req.txt", "python train.py"],
        "entrypoint": None,
        "env": {"A": "1", "TOKEN": "secret"},
        "secret_env": ["TOKEN"],
        "working_dir": "/workflow",
        "user": "1000:1000",
        "ports": [{"container_port": 8000, "host_port": None}],
        "gpus": [0, 3],
        "cpus": 2.5,
        "memory": 8 * 2**30,
        "shm_size": 2**30,
        "volumes": [{"host_path": "/data", "container_path": "/data", "read_only": True}],
        "network_mode": "bridge",
        "labels": {"team": "ml"},
        "privileged": False,
        "stop_timeout": 30.0,
        "max_duration": 3600.0,
        "registry_auth": {"username": "robot$ci", "password": "pull-pw-1"},
    }
    spec = parse_job_spec(data)
    assert spec.gpu_count == 2
    assert spec.to_dict(redact=False) == data
    redacted = spec.to_dict()
    assert redacted["env"] == {"A": "1", "TOKEN": "(redacted)"}
    assert redacted["registry_auth"] == {"username": "(redacted)", "password": "(redacted)"}
    assert parse_job_spec(redacted).to_dict() == redacted
    assert "pull-pw-1" not in repr(spec) and "robot$ci" not in repr(spec)


@pytest.mark.parametrize(
    ("registry_auth", "message"),
    [
        ({"username": "u"}, "must be an object with exactly username and password"),
        ({"username": "u", "password": "p", "token": "t"}, "exactly username and password"),
        ("u:p", "must be an object with exactly username and password"),
        ({"username": "", "password": "p"}, "must not be empty"),
    ],
)
def test_registry_auth_must_be_a_username_and_a_password(
    registry_auth: object, message: str
) -> None:
    found = problems(base(image="busybox", registry_auth=registry_auth))
    assert message in found["registry_auth"]
    assert problems(base(image="busybox", registry_auth={"username": "u", "password": 7})) == {
        "registry_auth.password": "must be a string, not an integer"
    }


def test_registry_auth_needs_an_image() -> None:
    found = problems(base(registry_auth={"username": "u", "password": "p"}))
    assert found["registry_auth"] == "needs an image to pull"


def test_ports_accept_bare_numbers() -> None:
    spec = parse_job_spec(base(image="x", ports=[8000]))
    assert spec.ports[0].container_port == 8000 and spec.ports[0].host_port is None


def test_every_problem_is_reported_with_its_field() -> None:
    found = problems(
        {
            "id": "bad id!",
            "commands": "echo",
            "env": {"BAD=NAME": "x", "BIG": "v" * (ENV_VALUE_MAX + 1), "NUM": 3},
            "secret_env": ["MISSING"],
            "gpus": -1,
            "cpus": 0,
            "memory": 1024,
            "network_mode": "overlay",
            "labels": {"dstack-plan.job-id": "x"},
            "stop_timeout": True,
            "max_duration": -5,
            "colour": "red",
            "user": "root; rm",
        }
    )
    assert found["id"].startswith("must be 1-128")
    assert found["run_name"] == "is required"
    assert "must be a list of strings" in found["commands"]
    assert "not a valid variable name" in found["env.BAD=NAME"]
    assert found["env.BIG"] == f"is {ENV_VALUE_MAX + 1} bytes; the limit is {ENV_VALUE_MAX}"
    assert "must be a string" in found["env.NUM"]
    assert "must name a variable given in env" in found["secret_env[0]"]
    assert "between 0 and" in found["gpus"]
    assert found["cpus"].startswith("must be > 0")
    assert "between 6291456" in found["memory"]
    assert "host, bridge" in found["network_mode"]
    assert "set by the agent" in found["labels.dstack-plan.job-id"]
    assert "must be a number, not a boolean" in found["stop_timeout"]
    assert found["max_duration"].startswith("must be > 0")
    assert found["colour"] == "unknown field"
    assert "user[:group]" in found["user"]


def test_process_jobs_reject_container_only_fields() -> None:
    found = problems(
        {
            "run_name": "r",
            "volumes": [{"host_path": "/a", "container_path": "/b"}],
            "privileged": True,
            "network_mode": "bridge",
        }
    )
    assert "needs commands or an entrypoint" in found["commands"]
    assert "cannot mount" in found["volumes"]
    assert "no container" in found["privileged"]
    assert "host network" in found["network_mode"]


def test_container_paths_must_be_absolute() -> None:
    found = problems(
        base(
            image="busybox",
            working_dir="rel",
            volumes=[{"host_path": "data", "container_path": "/"}],
        )
    )
    assert "absolute path inside the container" in found["working_dir"]
    assert "absolute" in found["volumes[0].host_path"]
    assert "must not be /" in found["volumes[0].container_path"]


def test_gpu_indices_must_be_distinct() -> None:
    assert "listed twice" in problems(base(gpus=[1, 1]))["gpus"]
    assert parse_job_spec(base(gpus=[2, 0])).gpus == (2, 0)


def test_nul_bytes_are_refused() -> None:
    assert "NUL" in problems(base(commands=["echo \x00"]))["commands[0]"]
