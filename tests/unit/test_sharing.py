"""Exports kept in the owner's state, `.dstack/projects.yml`, and how an importer sees the
owner's fleet (its own SSH identity, the owner's pins)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from dstack_plan.config.loader import load_text
from dstack_plan.config.profile import reference_parts
from dstack_plan.config.quotas import ProjectQuota, parse_quotas
from dstack_plan.config.runs import RunSpec
from dstack_plan.errors import ConfigError, DstackPlanError
from dstack_plan.inspect.top import TopView
from dstack_plan.project import Project
from dstack_plan.runs.quota_gate import QuotaHold, hold_for_quota
from dstack_plan.scheduler.quotas import Ask, Usage, check_project, project_over_daily
from dstack_plan.sharing.exports import created, deleted, importer_of, updated
from dstack_plan.sharing.imports import Imports, NotImported, importer_ssh_config, is_imported
from dstack_plan.sharing.policy import limits_for, published
from dstack_plan.sharing.projects_file import ProjectsFile, SSHIdentity, load_projects
from dstack_plan.state.codec import parse_state
from dstack_plan.state.exports import Importer, exported_to
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.model import ResourceState, State, timestamp
from dstack_plan.state.render import Renderer
from dstack_plan.web.source import ApiSource
from tests.infra.recording_clock import RecordingClock

ML = Importer(project="ml", state="/srv/ml/state.json")


def _fleet(name: str, ssh: dict | None = None) -> ResourceState:
    now = timestamp(RecordingClock())
    spec = {"type": "fleet", "name": name, "ssh_config": ssh or {"user": "root", "hosts": []}}
    return ResourceState(
        kind="fleet", name=name, provider="ssh", spec=spec, status="active",
        created_at=now, updated_at=now,
    )  # fmt: skip


def _gateway(name: str) -> ResourceState:
    now = timestamp(RecordingClock())
    return ResourceState(
        kind="gateway", name=name, provider="ssh", spec={"type": "gateway", "name": name},
        status="running", created_at=now, updated_at=now,
    )  # fmt: skip


def _owner() -> State:
    return State.empty().with_resource(_fleet("gpu")).with_resource(_fleet("cpu"))


def test_an_export_survives_the_state_file_and_renders_as_to_json() -> None:
    state = created(_owner(), "share", ["gpu"], [], [ML])
    text = Renderer().render(state)
    assert text.decode() == state.to_json()
    assert parse_state(text, "state.json") == state
    assert exported_to(state.exports, "fleet", "gpu", "ml") == "share"
    assert exported_to(state.exports, "fleet", "cpu", "ml") is None
    assert exported_to(state.exports, "fleet", "gpu", "other") is None
    # a state without exports is written as before exports existed
    assert "exports" not in _owner().to_json()


def test_export_edits_refuse_what_the_state_lacks_and_keep_the_state_unchanged() -> None:
    owner = _owner()
    with pytest.raises(
        DstackPlanError, match=r"no fleet 'tpu' in this project's state \(its fleets: cpu, gpu\)"
    ):
        created(owner, "share", ["tpu"], [], [ML])
    with pytest.raises(DstackPlanError, match="name a --fleet or a --gateway"):
        created(owner, "share", [], [], [ML])
    with pytest.raises(DstackPlanError, match="name an --importer"):
        created(owner, "share", ["gpu"], [], [])
    shared = created(owner, "share", ["gpu"], [], [ML])
    with pytest.raises(DstackPlanError, match="export 'share' exists"):
        created(shared, "share", ["cpu"], [], [ML])
    with pytest.raises(DstackPlanError, match=r"no export 'nope' \(exports: share\)"):
        deleted(shared, "nope")
    assert owner.exports == {}


def test_updating_an_export_adds_and_removes_fleets_and_importers() -> None:
    team = Importer(project="team", state="s3://bucket/team.json")
    state = created(_owner(), "share", ["gpu"], [], [ML])
    state = updated(state, "share", add_fleets=["cpu"], add_importers=[team])
    assert exported_to(state.exports, "fleet", "cpu", "team") == "share"
    state = updated(state, "share", remove_fleets=["gpu"], remove_importers=["ml"])
    assert state.exports["share"].fleets == ("cpu",)
    assert [i.project for i in state.exports["share"].importers] == ["team"]
    assert deleted(state, "share").exports == {}


def test_an_importer_is_named_with_its_state_or_found_in_the_projects_file(
    tmp_path: Path,
) -> None:
    projects = ProjectsFile.model_validate({"projects": {"ml": {"state": "../ml/state.json"}}})
    assert importer_of("ml", tmp_path, projects) == Importer(
        project="ml", state=str((tmp_path / "../ml/state.json").resolve())
    )
    url = "s3://bucket/ml/state.json"
    assert importer_of(f"ml={url}", tmp_path, ProjectsFile()).state == url
    with pytest.raises(DstackPlanError, match=r"--importer team: where is its state\?"):
        importer_of("team", tmp_path, projects)
    with pytest.raises(DstackPlanError, match="invalid project name 'a b'"):
        importer_of("a b=/x", tmp_path, projects)


def test_the_projects_file_reports_problems_where_they_are(tmp_path: Path) -> None:
    (tmp_path / ".dstack").mkdir()
    path = tmp_path / ".dstack" / "projects.yml"
    path.write_text("projects:\n  platform:\n    state: /x\n    ssh: {usr: alice}\n")
    with pytest.raises(ConfigError) as caught:
        load_projects(tmp_path)
    [issue] = caught.value.issues
    assert (issue.file, issue.line) == (".dstack/projects.yml", 4)
    assert "usr" in issue.message
    path.write_text("projects:\n  platform:\n    state: s3://b/k\n    ssh: {user: alice}\n")
    loaded = load_projects(tmp_path).projects["platform"]
    assert loaded.state == "s3://b/k" and loaded.ssh == SSHIdentity(user="alice")


def test_an_importer_reaches_hosts_with_its_own_identity_never_the_owner_s_keys() -> None:
    owner = {
        "user": "ubuntu",
        "identity_file": "/home/platform/.ssh/id_ed25519",
        "ssh_key": {"public": "ssh-ed25519 AAAA", "private": "sha256:abc"},
        "hosts": [{"hostname": "h1", "user": "admin", "identity_file": "/k"}, "h2"],
    }
    mine = importer_ssh_config(owner, None)
    assert mine == {"user": "ubuntu", "hosts": [{"hostname": "h1", "user": "admin"}, "h2"]}
    given = importer_ssh_config(owner, SSHIdentity(user="alice", identity_file="~/.ssh/a"))
    assert given == {
        "user": "alice",
        "identity_file": "~/.ssh/a",
        "hosts": [{"hostname": "h1"}, "h2"],
    }


def test_placing_needs_the_export_listing_needs_only_the_fleet(tmp_path: Path) -> None:
    owner_dir, ml_dir = tmp_path / "platform", tmp_path / "ml"
    (ml_dir / ".dstack").mkdir(parents=True)
    (ml_dir / ".dstack" / "projects.yml").write_text(
        f"projects:\n  platform:\n    state: {owner_dir}/state.json\n"
    )
    backend = LocalBackend(owner_dir / "state.json")
    backend.write(_owner(), backend.read().version)
    imports = Imports(ml_dir, "ml")
    assert imports.fleet("platform/gpu", placing=False).name == "gpu"
    with pytest.raises(NotImported, match="is not exported to project 'ml'"):
        imports.fleet("platform/gpu", placing=True)
    with pytest.raises(NotImported, match=r"its fleets: cpu, gpu"):
        imports.fleet("platform/tpu", placing=False)
    with pytest.raises(NotImported, match=r"project 'team' is not in \.dstack/projects\.yml"):
        imports.fleet("team/gpu", placing=False)


def test_an_owner_publishes_its_importers_limits_and_importers_read_them() -> None:
    quotas = parse_quotas(
        "namespaces:\n  dev: {gpus: 2}\nprojects:\n  ml: {gpus: 4, guarantee: 50%}\n"
    )
    policy = published(quotas)
    assert policy == {"projects": {"ml": {"gpus": 4.0, "guarantee": "50%"}}}
    owner = _owner().model_copy(update={"policy": policy})
    assert parse_state(Renderer().render(owner), "state.json") == owner
    assert limits_for("platform", owner, "ml") == quotas.projects["ml"]
    assert limits_for("platform", owner, "other") is None
    assert published(parse_quotas("namespaces:\n  dev: {gpus: 2}\n")) == {}


def test_a_project_over_the_owner_s_limit_is_named_with_the_limit_and_the_amount() -> None:
    limits = ProjectQuota(gpus=4, gpu_hours_per_day=10)
    asks = [Ask("task.train", "default", "alice", 3, 0.0)]
    [over] = check_project("ml", limits, Usage(gpus=2), asks)
    assert over.text() == "project ml: gpus limit 4, 2 in use, task.train asks 3"
    assert check_project("ml", limits, Usage(gpus=1), asks) == []
    daily = project_over_daily("ml", limits, Usage(gpu_hours_today=12.5))
    assert daily is not None and daily.text() == (
        "project ml: gpu_hours_per_day limit 10, 12.5 used today"
    )
    assert project_over_daily("ml", limits, Usage(gpu_hours_today=10)) is None


def test_a_guarantee_is_a_gpu_count_or_a_percent() -> None:
    with pytest.raises(
        ConfigError, match=r"projects\.ml\.guarantee: expected a GPU count or a percent"
    ):
        parse_quotas("projects:\n  ml: {guarantee: 150%}\n")
    with pytest.raises(ConfigError, match="invalid project name"):
        parse_quotas("projects:\n  m l: {gpus: 1}\n")
    assert parse_quotas("projects:\n  ml: {guarantee: 2}\n").projects["ml"].guarantee == 2


def test_dstack_s_cross_project_references_load_and_resolve(tmp_path: Path) -> None:
    """Every run of the conformance cases (from dstack's docs and parser) that dstack accepts
    and that names another project's fleet or gateway loads here, and resolves once
    `.dstack/projects.yml` names that project and it exports the fleet or gateway to this
    one."""
    conformance = Path(__file__).resolve().parent.parent / "conformance"
    cases = yaml.safe_load((conformance / "references.yml").read_text())
    verdicts = json.loads((conformance / "references.verdicts.json").read_text())
    resolved = 0
    for case in cases:
        text = case["config"]
        if verdicts.get(case["name"], {}).get("dstack") != "accept":
            continue
        if "fleets:" not in text and "gateway:" not in text:
            continue
        [resource], issues = load_text(text, "c.dstack.yml")
        assert not issues, case["name"]
        spec = resource.spec
        if not isinstance(spec, RunSpec):
            continue
        for name in (n for n in spec.placement_fleets() if is_imported(n)):
            owner, _, fleet = name.partition("/")
            owner_dir, ml_dir = tmp_path / case["name"] / owner, tmp_path / case["name"] / "ml"
            (ml_dir / ".dstack").mkdir(parents=True, exist_ok=True)
            (ml_dir / ".dstack" / "projects.yml").write_text(
                f"projects:\n  {owner}:\n    state: {owner_dir}/state.json\n"
            )
            backend = LocalBackend(owner_dir / "state.json")
            shared = created(State.empty().with_resource(_fleet(fleet)), "e", [fleet], [], [ML])
            backend.write(shared, backend.read().version)
            assert Imports(ml_dir, "ml").fleet(name, placing=True).name == fleet
            resolved += 1
        gateway = getattr(spec, "gateway", None)
        if gateway is None or isinstance(gateway, bool) or reference_parts(gateway)[0] is None:
            continue
        owner, name = reference_parts(gateway)
        assert owner is not None
        owner_dir, ml_dir = tmp_path / case["name"] / owner, tmp_path / case["name"] / "ml"
        (ml_dir / ".dstack").mkdir(parents=True, exist_ok=True)
        (ml_dir / ".dstack" / "projects.yml").write_text(
            f"projects:\n  {owner}:\n    state: {owner_dir}/state.json\n"
        )
        backend = LocalBackend(owner_dir / "state.json")
        owned = State.empty().with_resource(_gateway(name))
        backend.write(created(owned, "e", [], [name], [ML]), backend.read().version)
        assert Imports(ml_dir, "ml").gateway(owner, name).name == name
        resolved += 1
    # `fleets: [team/gpu]`, `fleets: [{project: team, name: gpu}]`, and both gateway forms
    assert resolved >= 4


def test_a_queued_run_on_an_owner_s_fleet_waits_while_its_project_is_at_the_owner_s_limit(
    tmp_path: Path,
) -> None:
    """What watch checks before it starts a queued run: the owner's published limits for this
    project, as the plan checks them."""
    owner_dir, ml_dir = tmp_path / "platform", tmp_path / "ml"
    (ml_dir / ".dstack").mkdir(parents=True)
    (ml_dir / ".dstack" / "projects.yml").write_text(
        f"projects:\n  platform:\n    state: {owner_dir}/state.json\n"
    )
    backend = LocalBackend(owner_dir / "state.json")
    policy = published(parse_quotas("projects:\n  ml: {gpus: 0}\n"))
    backend.write(_owner().model_copy(update={"policy": policy}), backend.read().version)
    now = timestamp(RecordingClock())
    run = ResourceState(
        kind="task", name="train", provider="ssh", status="pending",
        spec={"type": "task", "name": "train", "commands": ["x"], "resources": {"gpu": 1}},
        attributes={"fleet": "platform/gpu", "jobs": []}, created_at=now, updated_at=now,
    )  # fmt: skip
    imports = Imports(ml_dir, "ml")
    with pytest.raises(QuotaHold, match="project ml: gpus limit 0, 0 in use, task.train asks 1"):
        hold_for_quota(ml_dir, State.empty().with_resource(run), run, 0.0, imports)
    hold_for_quota(ml_dir, State.empty().with_resource(run), run, 0.0)  # no imports: none


def test_the_ui_lists_an_imported_fleet_with_its_owner(tmp_path: Path) -> None:
    """`/api/fleets` (what `fleet list --json` gives too): this project's fleets, then those
    other projects export to it, named `owner/name` with their `owner`."""
    owner_dir, ml_dir = tmp_path / "platform", tmp_path / "ml"
    (ml_dir / ".dstack").mkdir(parents=True)
    (ml_dir / ".dstack" / "projects.yml").write_text(
        f"projects:\n  platform:\n    state: {owner_dir}/state.json\n"
    )
    backend = LocalBackend(owner_dir / "state.json")
    backend.write(created(_owner(), "share", ["gpu"], [], [ML]), backend.read().version)
    project = Project(ml_dir, agent_dir=tmp_path / "agent")
    source = ApiSource(project, new_project=lambda: project)

    async def no_hosts() -> TopView:  # the fleet has none: no agent to ask
        return TopView(taken_at=0.0, hosts=())

    source.hosts = no_hosts  # type: ignore[method-assign]
    listed = asyncio.run(source.fleets())
    assert [(f.name, f.owner) for f in listed.fleets] == [("platform/gpu", "platform")]


def test_another_project_s_gateway_serves_this_one_only_while_exported_to_it(
    tmp_path: Path,
) -> None:
    from dstack_plan.state.exports import Export

    owner_dir, ml_dir = tmp_path / "platform", tmp_path / "ml"
    (ml_dir / ".dstack").mkdir(parents=True)
    (ml_dir / ".dstack" / "projects.yml").write_text(
        f"projects:\n  platform:\n    state: {owner_dir}/state.json\n"
    )
    backend = LocalBackend(owner_dir / "state.json")
    backend.write(_owner().with_resource(_gateway("gw")), backend.read().version)
    with pytest.raises(NotImported, match="gateway 'gw' of project 'platform' is not exported"):
        Imports(ml_dir, "ml").gateway("platform", "gw")
    with pytest.raises(NotImported, match=r"no such gateway \(its gateways: gw\)"):
        Imports(ml_dir, "ml").gateway("platform", "edge")
    share = Export(name="share", gateways=("gw",), importers=(ML,))
    state = backend.read().state.model_copy(update={"exports": {"share": share}})
    backend.write(state, backend.read().version)
    assert Imports(ml_dir, "ml").gateway("platform", "gw").name == "gw"
    with pytest.raises(NotImported, match="not exported to project 'other'"):
        Imports(ml_dir, "other").gateway("platform", "gw")
