"""Limits dstack checks in its server, not its parser: the file loads, `plan` and `validate`
refuse it, at the same location. References (fleets, instances, gateway) and group IP
references, from loading to the job an agent receives."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dstack_plan.config import interpolation
from dstack_plan.config.loader import load_project, load_text
from dstack_plan.config.runs import RunSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import ConfigError
from dstack_plan.graph.references import dependencies
from dstack_plan.project import Project
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job
from tests.conftest import run_main

SSH = "type: fleet\nname: ssh\nssh_config:\n"

# (id, config, the error's "line:col: message" as plan and validate print it)
LIMITS = [
    (
        "fleet-without-nodes-or-ssh",
        "type: fleet\nname: pool\n",
        "1:1: a fleet needs 'nodes' (cloud fleet) or 'ssh_config' (SSH fleet)",
    ),
    (
        "ssh-host-without-user",
        SSH + "  hosts:\n    - 10.0.0.1\n",
        "5:7: host 10.0.0.1: no user (set ssh_config.user or the host's)",
    ),
    (
        "ssh-host-mapping-without-user",
        SSH + "  user: ''\n  hosts:\n    - hostname: 10.0.0.2\n",
        "6:7: host 10.0.0.2: no user (set ssh_config.user or the host's)",
    ),
    (
        "ssh-fleet-with-nodes",
        "type: fleet\nname: ssh\nnodes: 2\nssh_config:\n  user: u\n  hosts: [h1]\n",
        "3:1: SSH fleets do not take nodes",
    ),
    (
        "ssh-host-twice",
        SSH + "  user: u\n  hosts: [h1, h1]\n",
        "5:15: host h1 port 22 is listed twice (first as ssh_config.hosts[0])",
    ),
    (
        "internal-ip-on-some-hosts",
        SSH + "  user: u\n  hosts:\n    - {hostname: h1, internal_ip: 10.1.0.1}\n    - h2\n",
        "5:3: internal_ip must be set on all hosts or on none",
    ),
    (
        "cloud-fleet-env",
        "type: fleet\nname: pool\nnodes: 1\nenv: {A: b}\n",
        "4:1: 'env' is only for SSH fleets",
    ),
    (
        "gateway-replicas-above-3",
        "type: gateway\nname: gw\nbackend: aws\nregion: us-east-1\nreplicas: 4\n"
        "certificate: null\n",
        "5:11: a gateway has at most 3 replicas, got 4",
    ),
    (
        "gateway-replicas-with-lets-encrypt",
        "type: gateway\nname: gw\nbackend: aws\nregion: us-east-1\nreplicas: 2\n",
        "5:11: a gateway with more than one replica cannot use a lets-encrypt certificate: set "
        "'certificate' to null (no HTTPS) or {type: acm, arn} (AWS)",
    ),
]


def project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "c.dstack.yml").write_text(text)
    return tmp_path


def plan_errors(directory: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        Project(directory, state_path=directory / "state.json").desired_items()
    return [str(i) for i in info.value.issues]


@pytest.mark.parametrize(("text", "error"), [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS])
def test_a_server_limit_loads_and_plan_and_validate_refuse_it_located(
    text: str,
    error: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, issues = load_text(text, "c.dstack.yml")
    assert not issues, "dstack's parser accepts this, so loading must too"
    directory = project(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        asyncio.run(Project(directory, state_path=directory / "state.json").plan())
    expected = f"c.dstack.yml:{error.replace(': ', ': error: ', 1)}"
    assert [str(i) for i in info.value.issues] == [expected]
    code, _, err = run_main(monkeypatch, capsys, "validate", str(directory))
    assert code == 1
    assert err.splitlines() == [expected]


def test_limits_and_reference_errors_are_reported_together(tmp_path: Path) -> None:
    directory = project(
        tmp_path,
        "type: fleet\nname: pool\n---\ntype: task\nname: tt\ncommands: [x]\nfleets: [nope]\n",
    )
    assert plan_errors(directory) == [
        "c.dstack.yml:1:1: error: a fleet needs 'nodes' (cloud fleet) or 'ssh_config' (SSH fleet)",
        "c.dstack.yml:7:1: error: task.tt refers to fleet.nope, which is not declared",
    ]


def test_validate_json_reports_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = project(tmp_path, "type: fleet\nname: pool\n")
    code, out, _ = run_main(monkeypatch, capsys, "validate", "--json", str(directory))
    assert code == 1
    [error] = json.loads(out)["errors"]
    assert (error["line"], error["column"]) == (1, 1) and "needs 'nodes'" in error["message"]


def test_other_projects_fleets_and_gateways_resolve_at_plan_their_instances_are_refused(
    tmp_path: Path,
) -> None:
    """`fleets: [team/gpu]` and `gateway: {project: team, name: gw}` pass the load-time
    checks (the plan resolves them against `.dstack/projects.yml`); another project's fleet
    in an instance selector is refused where it is written."""
    directory = project(
        tmp_path,
        "type: service\nname: sv\ncommands: [x]\nport: 80\ngateway: {project: team, name: gw}\n"
        "fleets: [team/gpu]\ninstances:\n  - fleet: {project: team, name: gpu}\n    instance: 0\n",
    )
    why = "references to other projects are not supported here yet"
    assert plan_errors(directory) == [
        f"c.dstack.yml:8:5: error: fleet 'gpu' of project 'team': {why} (use fleets: [team/gpu])",
    ]


def test_this_projects_references_in_mapping_form_are_edges(tmp_path: Path) -> None:
    directory = project(
        tmp_path,
        "type: gateway\nname: gw\nbackend: aws\nregion: us-east-1\n---\n"
        "type: fleet\nname: gpu\nnodes: 1\n---\n"
        "type: service\nname: sv\ncommands: [x]\nport: 80\ngateway: {name: gw}\n"
        "fleets: [{name: gpu}]\n",
    )
    edges = dependencies(load_project(directory), directory)
    assert edges["service.sv"] == ("fleet.gpu", "gateway.gw")


def test_an_inline_private_key_never_reaches_the_stored_spec() -> None:
    text = (
        SSH
        + "  user: u\n  ssh_key: {public: ssh-ed25519 AAAA, private: TOP-SECRET}\n  hosts: [h1]\n"
    )
    [resource], issues = load_text(text, "c.dstack.yml")
    assert not issues
    stored = json.dumps(resource.normalized)
    assert "TOP-SECRET" not in stored
    assert resource.normalized["ssh_config"]["ssh_key"]["private"].startswith("sha256:")
    assert resource.normalized["ssh_config"]["ssh_key"]["public"] == "ssh-ed25519 AAAA"


# -- group IP references --------------------------------------------------------------------

SERVICE_GROUPS = """\
type: service
name: pd
port: 8000
replicas:
  - name: workers
    count: 2
    commands: [serve]
  - name: router
    count: 1
    commands:
      - route --to ${{ groups[0].replicas[1].IP_ADDRESS }}
"""


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "type: task\nname: tt\nnodes: 2\n"
            "commands: ['ping ${{ groups[0].nodes[2].IP_ADDRESS }}']\n",
            "4:12: error: groups[0].nodes[2].IP_ADDRESS: out of range: group 0 has 2 nodes",
        ),
        (
            "type: task\nname: tt\ncommands: ['ping ${{ groups[0].replicas[0].IP_ADDRESS }}']\n",
            "3:12: error: groups[0].replicas[0].IP_ADDRESS: a task's commands refer to "
            "groups[N].nodes[M], not replicas",
        ),
        (
            SERVICE_GROUPS.replace("replicas[1]", "replicas[2]"),
            "11:9: error: groups[0].replicas[2].IP_ADDRESS: out of range: group 0 has 2 replicas",
        ),
        (
            SERVICE_GROUPS.replace(
                "count: 2", "count: 0..2\n    scaling: {metric: rps, target: 1}"
            ),
            "12:9: error: groups[0].replicas[1].IP_ADDRESS: this group scales to zero, so no "
            "replica is guaranteed at start",
        ),
        (
            "type: task\nname: tt\ncommands: [x]\n"
            "env:\n  PEER: ${{ groups[0].nodes[0].IP_ADDRESS }}\n",
            "5:3: error: env PEER: groups IP references are only for commands",
        ),
    ],
    ids=["out-of-range", "wrong-member", "replica-out-of-range", "scales-to-zero", "in-env"],
)
def test_group_references_dstack_refuses_are_refused_at_plan(
    text: str, error: str, tmp_path: Path
) -> None:
    _, issues = load_text(text, "c.dstack.yml")
    assert not issues
    assert plan_errors(project(tmp_path, text)) == [f"c.dstack.yml:{error}"]


def test_group_references_resolve_to_the_jobs_machine(tmp_path: Path) -> None:
    text = (
        "type: task\nname: tt\nnodes: 2\n"
        "commands: ['ping ${{ groups[0].nodes[1].IP_ADDRESS }} $${{ kept }}']\n"
    )
    [resource], issues = load_text(text, "c.dstack.yml")
    assert not issues and isinstance(resource.spec, RunSpec)
    Project(project(tmp_path, text), state_path=tmp_path / "s.json").desired_items()
    ctx = JobContext("tt", "id", 0, "abc", 2, "10.0.0.1", ("10.0.0.1", "10.0.0.2"))
    job = build_job(resource.spec, JobSlot(0, 0), ctx, SecretStore(tmp_path))
    assert job.commands == ["ping 10.0.0.2 $${{ kept }}"]


def test_service_replica_references_resolve_to_the_runs_machine(tmp_path: Path) -> None:
    [resource], issues = load_text(SERVICE_GROUPS, "c.dstack.yml")
    assert not issues and isinstance(resource.spec, RunSpec)
    Project(project(tmp_path, SERVICE_GROUPS), state_path=tmp_path / "s.json").desired_items()
    values = interpolation.group_values("replicas", [["10.0.0.1", "10.0.0.1"], ["10.0.0.1"]])
    command = "route --to ${{ groups[0].replicas[1].IP_ADDRESS }}"
    assert interpolation.resolve(command, {"groups": values}) == "route --to 10.0.0.1"


def test_an_escaped_expression_is_no_reference() -> None:
    assert interpolation.parse_references("echo $${{ anything at all }}") == []
    _, issues = load_text("type: task\ncommands: ['echo $${{ vars.X }}']\n", "c.dstack.yml")
    assert not issues
