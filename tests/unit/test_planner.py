"""The pure diff: one change per address, with the right action and reason."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from dstack_plan.config.loader import load_project
from dstack_plan.errors import ConfigError, PlanError
from dstack_plan.graph import dag
from dstack_plan.graph.references import dependencies
from dstack_plan.plan.json_plan import plan_to_json
from dstack_plan.plan.model import Action, Plan
from dstack_plan.plan.normalize import spec_from_normalized
from dstack_plan.plan.planfile import check_not_stale, load_plan, save_plan
from dstack_plan.plan.planner import DesiredItem, PlanInputs, PlanOptions, make_plan
from dstack_plan.state.backend import StateSnapshot
from dstack_plan.state.model import ResourceState, State

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def desired_items(tmp_path: Path, text: str) -> list[DesiredItem]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "p.dstack.yml").write_text(text)
    desired = load_project(tmp_path)
    edges = dependencies(desired, tmp_path)
    return [
        DesiredItem(r.address, r.kind, r.name, "local", r.normalized, edges[r.address])
        for r in desired
    ]


def state_of(items: list[DesiredItem], status: str = "running", **overrides) -> State:
    state = State.empty()
    for item in items:
        rs = ResourceState.create(
            item.address, provider=item.provider, spec=item.spec, status=status, now=NOW,
            depends_on=item.depends_on, **overrides,
        )  # fmt: skip
        state = state.with_resource(rs)
    return state.model_copy(update={"serial": 3})


def plan(items, state, exists=True, **options) -> Plan:
    return make_plan(
        PlanInputs(desired=items, state=state, state_exists=exists, options=PlanOptions(**options))
    )


def actions(p: Plan) -> dict[str, Action]:
    return {c.address: c.action for c in p.changes}


TASK = "type: task\nname: train\ncommands: [python train.py]\nresources: {gpu: A100:2}\n"
SERVICE = "type: service\nname: llm\ncommands: [serve]\nport: 8000\nreplicas: 1\n"
FLEET = "type: fleet\nname: pool\nnodes: 2\nresources: {gpu: A100:8}\n"
SSH_FLEET = (
    "type: fleet\nname: onprem\nssh_config:\n  user: u\n  hosts:\n"
    "    - h1\n    - hostname: h2\n      port: 2222\n"
)
VOLUME = "type: volume\nname: data\nbackend: aws\nregion: us-east-1\nsize: 100GB\n"
GATEWAY = "type: gateway\nname: gw\nbackend: aws\nregion: us-east-1\ndomain: a.com\n"
DEV = "type: dev-environment\nname: dev\nide: vscode\n"


def test_everything_new_is_created(tmp_path: Path) -> None:
    items = desired_items(tmp_path, "---\n".join([TASK, SERVICE, FLEET, VOLUME, GATEWAY, DEV]))
    p = plan(items, State.empty(), exists=False)
    assert set(actions(p).values()) == {Action.CREATE}
    assert p.summary() == "Plan: 6 to add, 0 to change, 0 to destroy."
    assert (p.lineage, p.serial) == ("", 0)


def test_unchanged_project_is_a_noop_also_after_reordering(tmp_path: Path) -> None:
    items = desired_items(tmp_path / "a", "---\n".join([TASK, SERVICE, FLEET]))
    state = state_of(items)
    reordered = (
        "resources: {gpu: 'A100:2'}\ncommands: [python train.py]\nname: train\ntype: task\n"
        "spot_policy: on-demand\n"
    )
    items2 = desired_items(tmp_path / "b", "---\n".join([FLEET, SERVICE, reordered]))
    p = plan(items2, state)
    assert not p.has_changes
    assert p.summary() == "Plan: 0 to add, 0 to change, 0 to destroy."


@pytest.mark.parametrize(
    "before, after, action, path",
    [
        (SERVICE, SERVICE.replace("replicas: 1", "replicas: 3"), Action.UPDATE, "replicas"),
        # what a container's replicas run rolls in place (a process binds its port on the
        # host: no new replica beside the old); how the service is exposed replaces it
        (SERVICE, SERVICE.replace("[serve]", "[serve2]"), Action.DELETE_THEN_CREATE, "commands"),
        (SERVICE + "image: x\n", SERVICE.replace("[serve]", "[serve2]") + "image: x\n",
         Action.UPDATE, "commands"),
        (SERVICE, SERVICE + "https: false\n", Action.DELETE_THEN_CREATE, "https"),
        (TASK, TASK.replace("A100:2", "A100:4"), Action.DELETE_THEN_CREATE, "resources.gpu"),
        (TASK, TASK + "priority: 50\n", Action.UPDATE, "priority"),
        (FLEET, FLEET.replace("nodes: 2", "nodes: 4"), Action.UPDATE, "nodes.max"),
        (FLEET, FLEET + "placement: cluster\n", Action.DELETE_THEN_CREATE, "placement"),
        (SSH_FLEET, SSH_FLEET + "    - h3\n", Action.UPDATE, "ssh_config.hosts"),
        # a host is its hostname and port: another port is another host, added in place
        (SSH_FLEET, SSH_FLEET.replace("2222", "2223"), Action.UPDATE, "ssh_config.hosts"),
        (SSH_FLEET, SSH_FLEET.replace("2222", "2222\n      user: v"), Action.DELETE_THEN_CREATE,
         "ssh_config.hosts"),
        (VOLUME, VOLUME.replace("100GB", "200GB") + "lifecycle: {prevent_destroy: false}\n",
         Action.DELETE_THEN_CREATE, "size"),
        (GATEWAY, GATEWAY.replace("a.com", "b.com"), Action.DELETE_THEN_CREATE, "domain"),
        (DEV, DEV + "inactivity_duration: 2h\n", Action.UPDATE, "inactivity_duration"),
        (DEV, DEV.replace("vscode", "cursor"), Action.DELETE_THEN_CREATE, "ide"),
        (TASK, TASK + "lifecycle: {ignore_changes: [resources]}\n", Action.UPDATE, "lifecycle"),
    ],
)  # fmt: skip
def test_classification(
    tmp_path: Path, before: str, after: str, action: Action, path: str
) -> None:
    state = state_of(desired_items(tmp_path / "a", before))
    p = plan(desired_items(tmp_path / "b", after), state)
    (change,) = [c for c in p.changes if c.action is not Action.NOOP]
    assert change.action is action
    assert any(p.startswith(path) for p in change.changed_paths)
    if action.is_replace:
        assert any(p.startswith(path) for p in change.replace_paths)
        assert change.reason.startswith("forces replacement: ")
        assert change.action_reason == "replace_because_cannot_update"


def test_create_before_destroy(tmp_path: Path) -> None:
    base = TASK + "lifecycle: {create_before_destroy: true}\n"
    state = state_of(desired_items(tmp_path / "a", base))
    p = plan(desired_items(tmp_path / "b", base.replace("A100:2", "A100:4")), state)
    assert p.changes[0].action is Action.CREATE_THEN_DELETE
    assert p.summary() == "Plan: 1 to add, 0 to change, 1 to destroy."


def test_ignore_changes_keeps_the_state_value(tmp_path: Path) -> None:
    base = TASK + "lifecycle: {ignore_changes: [resources.gpu]}\n"
    state = state_of(desired_items(tmp_path / "a", base))
    p = plan(desired_items(tmp_path / "b", base.replace("A100:2", "A100:4")), state)
    assert p.changes[0].action is Action.NOOP
    assert p.changes[0].after["resources"]["gpu"] == "A100:2"


def test_removed_resource_is_deleted_with_reason(tmp_path: Path) -> None:
    state = state_of(desired_items(tmp_path / "a", TASK + "---\n" + SERVICE))
    p = plan(desired_items(tmp_path / "b", SERVICE), state)
    change = p.change("task.train")
    assert change.action is Action.DELETE
    assert change.reason == "not in configuration"
    assert change.action_reason == "delete_because_no_resource_config"


def test_finished_task_with_unchanged_spec_is_noop_and_replace_reruns(tmp_path: Path) -> None:
    items = desired_items(tmp_path, TASK)
    state = state_of(items, status="done")
    assert plan(items, state).changes[0].action is Action.NOOP
    rerun = plan(items, state, replace=("task.train",)).changes[0]
    assert rerun.action is Action.DELETE_THEN_CREATE
    assert (rerun.reason, rerun.action_reason) == (
        "requested with --replace",
        "replace_by_request",
    )


def test_drift_plans_the_resource_again(tmp_path: Path) -> None:
    items = desired_items(tmp_path, SERVICE)
    inputs = PlanInputs(items, state_of(items), True, drift={"service.llm": "jobs gone"})
    change = make_plan(inputs).changes[0]
    assert (change.action, change.reason) == (Action.CREATE, "drift: jobs gone")


def test_tainted_resource_is_replaced(tmp_path: Path) -> None:
    items = desired_items(tmp_path, TASK)
    change = plan(items, state_of(items, tainted=True)).changes[0]
    assert change.action_reason == "replace_because_tainted"


def test_prevent_destroy_is_a_plan_error(tmp_path: Path) -> None:
    state = state_of(desired_items(tmp_path / "a", VOLUME))
    with pytest.raises(PlanError, match=r"volume\.data: lifecycle\.prevent_destroy"):
        plan([], state)
    with pytest.raises(PlanError, match="prevent_destroy"):
        plan([], state, destroy=True)
    assert plan([], state, destroy=True, allow_destroy_protected=("volume.data",)).has_changes
    task_state = state_of(
        desired_items(tmp_path / "b", TASK + "lifecycle: {prevent_destroy: true}\n")
    )
    with pytest.raises(PlanError, match="task.train"):
        plan([], task_state)


def test_destroy_orders_dependents_first_and_targets_pull_dependents(tmp_path: Path) -> None:
    items = desired_items(tmp_path, "---\n".join([FLEET, TASK, SERVICE]))
    state = state_of(items)
    p = plan(items, state, destroy=True)
    assert all(c.action is Action.DELETE for c in p.changes)
    targeted = plan(items, state, destroy=True, targets=("fleet.pool",))
    assert {c.address for c in targeted.changes} == {"fleet.pool", "task.train", "service.llm"}


def test_target_includes_dependencies_only(tmp_path: Path) -> None:
    items = desired_items(tmp_path, "---\n".join([FLEET, TASK, SERVICE]))
    p = plan(items, State.empty(), exists=False, targets=("task.train",))
    assert [c.address for c in p.changes] == ["fleet.pool", "task.train"]
    assert p.warnings
    with pytest.raises(PlanError, match="--target task.nope"):
        plan(items, State.empty(), exists=False, targets=("task.nope",))


def test_dependency_edges(tmp_path: Path) -> None:
    text = "---\n".join(
        [FLEET, VOLUME, GATEWAY.replace("a.com", "a.com\ndefault: true"),
         SERVICE + "fleets: [pool]\nvolumes: ['data:/data']\n",
         TASK + "depends_on: [service.llm]\n"]
    )  # fmt: skip
    edges = {i.address: set(i.depends_on) for i in desired_items(tmp_path, text)}
    assert edges["service.llm"] == {"fleet.pool", "volume.data", "gateway.gw"}
    assert edges["task.train"] == {"fleet.pool", "service.llm"}


def test_unknown_reference_is_a_located_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        desired_items(tmp_path, TASK + "fleets: [nope]\n")
    (issue,) = info.value.issues
    assert (issue.line, issue.column) == (5, 1)
    assert "task.train refers to fleet.nope, which is not declared" in issue.message


def test_cycle_names_the_cycle_in_order() -> None:
    rotations = ["task.a -> task.b -> task.c", "task.b -> task.c -> task.a"]
    rotations.append("task.c -> task.a -> task.b")
    with pytest.raises(PlanError) as info:
        dag.build({"task.a": ["task.b"], "task.b": ["task.c"], "task.c": ["task.a"]})
    message = str(info.value)
    assert any(message == f"dependency cycle: {r} -> {r[:6]}" for r in rotations), message


def test_deposed_object_is_work_to_do(tmp_path: Path) -> None:
    items = desired_items(tmp_path, TASK)
    state = state_of(items, attributes={"_deposed": [{"kind": "task"}]})
    change = plan(items, state).changes[0]
    assert change.action is Action.UPDATE
    assert "deposed" in change.reason


def test_dot_export() -> None:
    from dstack_plan.graph.export import to_dot

    dot = to_dot(dag.build({"task.a": ["fleet.f"], "fleet.f": []}))
    assert '"task.a" -> "fleet.f";' in dot and dot.startswith("digraph")


def test_json_plan_shape(tmp_path: Path) -> None:
    state = state_of(desired_items(tmp_path / "a", TASK))
    p = plan(
        desired_items(tmp_path / "b", TASK.replace("A100:2", "A100:4") + "---\n" + SERVICE), state
    )
    data = plan_to_json(p)
    assert data["format_version"] == "1.0"
    assert data["prior_state"] == {"lineage": state.lineage, "serial": 3}
    by_address = {rc["address"]: rc for rc in data["resource_changes"]}
    task = by_address["task.train"]
    assert task["type"] == "task" and task["name"] == "train"
    assert task["change"]["actions"] == ["delete", "create"]
    assert task["change"]["replace_paths"] == [["resources", "gpu"]]
    assert task["action_reason"] == "replace_because_cannot_update"
    assert by_address["service.llm"]["change"]["actions"] == ["create"]
    assert data["summary"] == {"add": 2, "change": 0, "destroy": 1}
    assert set(data["cost"]) == {"currency", "period", "before", "after"}


def test_saved_plan_round_trip_and_staleness(tmp_path: Path) -> None:
    items = desired_items(tmp_path, TASK)
    state = state_of(items)
    p = plan(desired_items(tmp_path / "b", TASK.replace("A100:2", "A100:4")), state)
    path = tmp_path / "plan.json"
    save_plan(p, path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    loaded = load_plan(path)
    assert loaded == p
    check_not_stale(loaded, StateSnapshot(state, "3"), path)
    newer = state.model_copy(update={"serial": 4})
    with pytest.raises(PlanError, match="is stale"):
        check_not_stale(loaded, StateSnapshot(newer, "4"), path)
    other = State.empty().model_copy(update={"serial": 3})
    with pytest.raises(PlanError, match="does not match the state"):
        check_not_stale(loaded, StateSnapshot(other, "3"), path)
    path.write_text("{}")
    with pytest.raises(PlanError, match="not a saved plan"):
        load_plan(path)


def test_normalized_spec_round_trips(tmp_path: Path) -> None:
    for item in desired_items(
        tmp_path, "---\n".join([TASK, SERVICE, FLEET, SSH_FLEET, VOLUME, GATEWAY, DEV])
    ):
        spec = spec_from_normalized(item.kind, item.spec)
        assert spec.model_dump(mode="json", exclude_none=True) | {"name": item.name} == item.spec


def test_an_empty_fleets_list_means_any_declared_fleet(tmp_path: Path) -> None:
    items = desired_items(
        tmp_path,
        "type: fleet\nname: pool\nnodes: 1\n---\n"
        "type: task\nname: train\nfleets: []\ncommands: [x]\n",
    )
    train = next(i for i in items if i.address == "task.train")
    assert train.depends_on == ("fleet.pool",)
