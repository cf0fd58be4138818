"""`.dstack/backends.yml`: each backend type, located errors, and what `dstack init` writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.config.backends import (
    BACKENDS_FILE,
    AWSBackend,
    AzureBackend,
    BackendsFile,
    GCPBackend,
    backend_config,
    load_backends,
    parse_backends,
    render_backend,
    render_backends,
    save_backend,
)
from dstack_plan.errors import ConfigError

FULL = """\
backends:
  - type: aws
    regions: [eu-west-1, us-east-1]
    profile: ci
    vpc_id: vpc-1
    subnet_ids: [subnet-1]
    public_ips: false
    tags: {team: ml}
  - type: gcp
    project_id: my-project
    regions: [europe-west4]
    credentials_file: ~/sa.json
    network: default
    subnetwork: sub
    tags: {team: ml-infra_1}
  - type: azure
    subscription_id: sub-1
    tenant_id: t-1
    resource_group: rg
    client_id: app-1
    client_secret_env: AZURE_CLIENT_SECRET
"""


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_backends(text)
    return [str(issue) for issue in info.value.issues]


def test_each_type_parses() -> None:
    parsed = parse_backends(FULL)
    aws, gcp, azure = parsed.backends
    assert aws == AWSBackend(
        type="aws",
        regions=["eu-west-1", "us-east-1"],
        profile="ci",
        vpc_id="vpc-1",
        subnet_ids=["subnet-1"],
        public_ips=False,
        tags={"team": "ml"},
    )
    assert isinstance(gcp, GCPBackend)
    assert (gcp.project_id, gcp.credentials_file, gcp.public_ips) == (
        "my-project",
        "~/sa.json",
        True,
    )
    assert isinstance(azure, AzureBackend)
    assert azure.client_secret_env == "AZURE_CLIENT_SECRET"
    assert parsed.get("gcp") is gcp
    assert parsed.get("oracle") is None


def test_defaults() -> None:
    aws = parse_backends("backends:\n  - type: aws\n").backends[0]
    assert aws == AWSBackend(type="aws")
    assert (aws.regions, aws.profile, aws.public_ips, aws.tags) == (None, None, True, {})


def test_absent_file_is_empty(tmp_path: Path) -> None:
    assert load_backends(tmp_path) == BackendsFile(backends=[])
    assert backend_config(tmp_path, "aws") is None


def test_empty_file_is_empty() -> None:
    assert parse_backends("# nothing yet\n") == BackendsFile(backends=[])


def test_unknown_key_is_located() -> None:
    text = "backends:\n  - type: aws\n    regionz: [eu-west-1]\n"
    assert errors(text) == [
        f"{BACKENDS_FILE}:3:5: error: unknown key 'regionz' (did you mean 'regions'?)"
    ]


def test_unknown_top_level_key_is_located() -> None:
    assert errors("backend: aws\n") == [
        f"{BACKENDS_FILE}:1:1: error: unknown key 'backend' (did you mean 'backends'?)"
    ]


def test_unknown_type_says_which_exist() -> None:
    assert errors("backends:\n  - type: oracle\n") == [
        f"{BACKENDS_FILE}:2:11: error: backends.0.type: unknown backend type 'oracle': "
        "expected one of aws, gcp, azure, slurm, kubernetes"
    ]


def test_missing_type_and_required_fields() -> None:
    assert errors("backends:\n  - regions: [x]\n") == [
        f"{BACKENDS_FILE}:2:5: error: backends.0: missing required key 'type' "
        "(aws, gcp, azure, slurm, kubernetes)"
    ]
    assert errors("backends:\n  - type: gcp\n") == [
        f"{BACKENDS_FILE}:2:5: error: backends.0: missing required key 'project_id'"
    ]


def test_bad_value_is_located() -> None:
    assert errors("backends:\n  - type: aws\n    public_ips: maybe\n") == [
        f"{BACKENDS_FILE}:3:17: error: backends.0.public_ips: expected true or false, got 'maybe'"
    ]


def test_two_entries_of_a_type() -> None:
    text = "backends:\n  - type: aws\n  - type: gcp\n    project_id: p\n  - type: aws\n"
    assert errors(text) == [
        f"{BACKENDS_FILE}:5:11: error: backends.2.type: a second aws backend: "
        "at most one entry per type"
    ]


def test_client_secret_is_refused_without_echoing_it() -> None:
    text = "backends:\n  - type: azure\n    subscription_id: s\n    client_secret: hunter2\n"
    found = errors(text)
    assert found == [
        f"{BACKENDS_FILE}:4:5: error: backends.0.client_secret: secrets never go in the "
        "project; put the secret in an environment variable and name it with client_secret_env"
    ]
    assert "hunter2" not in found[0]


@pytest.mark.parametrize(
    ("tags", "where", "message"),
    [
        ("{Team: ml}", "5:7", "tags.Team: invalid GCP label key 'Team'"),
        ("{team: ML}", "5:13", "tags.team: invalid GCP label value 'ML'"),
        (f"{{team: {'x' * 64}}}", "5:13", "tags.team: invalid GCP label value"),
    ],
)
def test_bad_gcp_label(tags: str, where: str, message: str) -> None:
    text = f"backends:\n  - type: gcp\n    project_id: p\n    tags:\n      {tags.strip('{}')}\n"
    (found,) = errors(text)
    assert found.startswith(f"{BACKENDS_FILE}:{where}: error: backends.0.{message}")
    assert "lowercase" in found


def test_aws_tags_are_not_gcp_labels() -> None:
    aws = parse_backends("backends:\n  - type: aws\n    tags: {Team: ML}\n").backends[0]
    assert aws.tags == {"Team": "ML"}


def test_yaml_error_is_located() -> None:
    (found,) = errors("backends:\n  - type: aws\n    regions: [x\n")
    assert found.startswith(f"{BACKENDS_FILE}:")


@pytest.mark.parametrize(
    "backend",
    [
        AWSBackend(type="aws"),
        AWSBackend(type="aws", regions=["eu-west-1"], profile="ci", tags={"a": "b"}),
        GCPBackend(type="gcp", project_id="p", regions=["europe-west4"]),
        AzureBackend(type="azure", subscription_id="s", client_secret_env="SECRET_VAR"),
    ],
)
def test_render_round_trips(backend: AWSBackend | GCPBackend | AzureBackend) -> None:
    one = render_backend(backend)
    assert one.lstrip().startswith("# credentials:")
    assert parse_backends("backends:\n" + one).backends == [backend]
    assert parse_backends(render_backends(BackendsFile(backends=[backend]))).backends == [backend]


def test_render_is_minimal() -> None:
    text = render_backend(AWSBackend(type="aws", regions=["eu-west-1"]))
    body = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert body == ["  - type: aws", "    regions:", "    - eu-west-1"]


def test_save_replaces_its_type_and_keeps_the_others(tmp_path: Path) -> None:
    save_backend(tmp_path, GCPBackend(type="gcp", project_id="p"))
    save_backend(tmp_path, AWSBackend(type="aws", regions=["eu-west-1"]))
    save_backend(tmp_path, AWSBackend(type="aws", regions=["us-east-1"]))
    loaded = load_backends(tmp_path)
    assert [b.type for b in loaded.backends] == ["aws", "gcp"]
    assert backend_config(tmp_path, "aws") == AWSBackend(type="aws", regions=["us-east-1"])


def test_save_refuses_to_rewrite_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / BACKENDS_FILE
    path.parent.mkdir()
    path.write_text("backends:\n  - type: nope\n")
    with pytest.raises(ConfigError):
        save_backend(tmp_path, AWSBackend(type="aws"))
    assert path.read_text() == "backends:\n  - type: nope\n"
