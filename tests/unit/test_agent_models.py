"""Controller-side payload models and the Prometheus renderer."""

from __future__ import annotations

from pydantic import SecretStr

from dstack_plan.agent.api_models import JobInfo, JobSpec, JobStatus
from dstack_plan.agent.metrics import Family, render
from dstack_plan.agent.spec import parse_job_spec


def test_secret_env_is_unwrapped_only_on_the_wire() -> None:
    spec = JobSpec(run_name="r", commands=["x"], env={"K": SecretStr("v"), "P": "p"})
    assert "'v'" not in repr(spec) and "**********" in repr(spec)
    wire = spec.to_wire()
    assert wire["env"] == {"K": "v", "P": "p"} and wire["secret_env"] == ["K"]
    # The agent's own validator accepts exactly what the client sends.
    parsed = parse_job_spec(wire)
    assert parsed.to_dict()["env"] == {"K": "(redacted)", "P": "p"}


def test_config_secrets_are_accepted_and_stay_hidden() -> None:
    from dstack_plan.config.secrets import Secret

    spec = JobSpec(run_name="r", commands=["x"], env={"HF_TOKEN": Secret("hf_abc")})
    assert "hf_abc" not in repr(spec)
    assert spec.to_wire()["env"] == {"HF_TOKEN": "hf_abc"}
    assert spec.to_wire()["secret_env"] == ["HF_TOKEN"]


def test_wire_format_of_a_full_spec_is_accepted_by_the_agent() -> None:
    spec = JobSpec(
        run_name="r",
        image="busybox",
        commands=["echo"],
        ports=[{"container_port": 80}],
        gpus=[0],
        volumes=[{"host_path": "/a", "container_path": "/b"}],
        network_mode="bridge",
        memory=2**30,
        registry_auth={"username": "robot", "password": "pull-pw"},
    )
    assert parse_job_spec(spec.to_wire()).to_dict(redact=False) == spec.to_wire()


def test_job_info_tolerates_new_fields() -> None:
    info = JobInfo.model_validate(
        {
            "id": "j",
            "run_name": "r",
            "runtime": "process",
            "status": "failed",
            "submitted_at": 1.0,
            "something_new": True,
        }
    )
    assert info.finished and info.status is JobStatus.FAILED


def test_prometheus_rendering() -> None:
    family = Family("x_total", "counter", "Things").add(3, kind='a"b\n').add(None, kind="skip")
    empty = Family("unused", "gauge", "Nothing")
    assert render([family, empty, Family("y", "gauge", "Y").add(0.5)]) == (
        "# HELP x_total Things\n"
        "# TYPE x_total counter\n"
        'x_total{kind="a\\"b\\n"} 3\n'
        "# HELP y Y\n"
        "# TYPE y gauge\n"
        "y 0.5\n"
    )
