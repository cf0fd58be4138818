"""Policy rules on real plans (made by the planner from YAML): every variable and helper, deny
and warn, the shipped examples, and errors that must never pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dstack_plan.errors import ConfigError
from dstack_plan.plan.json_plan import plan_to_json
from dstack_plan.plan.model import Cost, Plan
from dstack_plan.policy.cel_check import DYN, ListOf, MapOf, Record, Scalar, Type
from dstack_plan.policy.evaluate import PolicyError, evaluate
from dstack_plan.policy.loader import load_rules, parse_rules
from dstack_plan.policy.schema import VARIABLES
from dstack_plan.policy.variables import plan_values, registry_of
from tests.unit.test_planner import desired_items, plan, state_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"

TRAIN = (
    "type: task\nname: train\nimage: nvcr.io/nvidia/pytorch:24.01-py3\nnodes: 2\n"
    "commands: [python train.py]\nnamespace: research\nlabels: {team: ml}\n"
    "resources: {gpu: A100:4..8}\n"
)
LLM = (
    "type: service\nname: llm\nimage: ubuntu:22.04\ncommands: [serve]\nport: 8000\n"
    "replicas: 3\nresources: {gpu: 0.25}\n"
)
VOLUME = "type: volume\nname: data\nbackend: aws\nregion: us-east-1\nsize: 100GB\n"


def rule(expression: str, severity: str = "deny", name: str = "r") -> str:
    return (
        f"rules:\n  - name: {name}\n    expression: {expression!r}\n"
        f"    message: {name} failed\n    severity: {severity}\n"
    )


def check(document: dict[str, Any], *texts: str) -> dict[str, str]:
    rules = [r for i, t in enumerate(texts) for r in parse_rules(t, f"p{i}.yml")]
    report = evaluate(rules, document)
    assert report.denied == any(r.outcome == "fail" and r.severity == "deny" for r in report.rules)
    return {r.name: r.outcome for r in report.rules}


def holds(document: dict[str, Any], expression: str) -> bool:
    return check(document, rule(expression))["r"] == "pass"


@pytest.fixture
def created(tmp_path: Path) -> dict[str, Any]:
    """Two runs created: a 2-node task asking A100:4..8 per node, a service of 3 replicas
    each asking a quarter of one GPU; cost $0 -> $12.5/h."""
    items = desired_items(tmp_path / "c", TRAIN + "---\n" + LLM)
    made = plan(items, state_of([]), exists=False)
    return plan_to_json(made.model_copy(update={"cost": Cost(before=0.0, after=12.5)}))


@pytest.fixture
def volume_gone(tmp_path: Path) -> dict[str, Any]:
    """A volume in state, gone from the configuration (its deletion allowed)."""
    in_state = desired_items(tmp_path / "v", VOLUME)
    items = desired_items(tmp_path / "w", LLM)
    made = plan(items, state_of(in_state), allow_destroy_protected=("volume.data",))
    return plan_to_json(made)


@pytest.fixture
def volume_replaced(tmp_path: Path) -> dict[str, Any]:
    items = desired_items(tmp_path / "r", VOLUME)
    made = plan(
        items, state_of(items), replace=("volume.data",), allow_destroy_protected=("volume.data",)
    )
    return plan_to_json(made)


def test_runs_count_gpus_per_job_and_in_total_with_nodes_replicas_and_shares(created) -> None:
    runs = {r["address"]: r for r in plan_values(created)["runs"]}
    assert runs["task.train"]["gpus_per_job"] == 4.0  # the lower bound of 4..8
    assert (runs["task.train"]["gpus"], runs["task.train"]["jobs"]) == (8.0, 2)
    assert (runs["service.llm"]["gpus"], runs["service.llm"]["jobs"]) == (0.75, 3)
    assert holds(created, "runs.all(r, r.gpus <= 8)")
    assert not holds(created, "runs.all(r, r.gpus < 8)")
    assert holds(created, "runs.exists(r, r.gpus_per_job == 0.25)")
    assert holds(created, "gpus.total == 8.75 && gpus.by_namespace['research'] == 8.0")
    assert holds(created, "gpus.by_namespace.default == 0.75")


def test_runs_carry_image_registry_labels_namespace_and_action(created) -> None:
    assert holds(created, "runs.all(r, r.action == 'create')")
    assert holds(created, "runs.filter(r, r.registry == 'docker.io').map(r, r.name) == ['llm']")
    assert holds(
        created, "runs.exists(r, r.image.startsWith('nvcr.io/') && r.registry == 'nvcr.io')"
    )
    assert holds(created, "runs.all(r, r.kind == 'service' || r.labels.team == 'ml')")
    assert not holds(created, "runs.all(r, 'team' in r.labels)")
    assert holds(created, "runs.exists(r, r.namespace == 'research')")
    assert holds(created, "runs.exists(r, r.namespace == 'default')")


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("ubuntu:22.04", "docker.io"),
        ("library/ubuntu", "docker.io"),
        ("dstackai/base:py3.12", "docker.io"),
        ("index.docker.io/library/ubuntu", "docker.io"),
        ("ghcr.io/org/img:1", "ghcr.io"),
        ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io"),
        ("localhost:5000/img", "localhost:5000"),
        ("localhost/img", "localhost"),
        ("Quay.IO/org/img@sha256:abc", "quay.io"),
        ("", ""),
    ],
)
def test_registry_of_follows_docker_reference_rules(image: str, registry: str) -> None:
    assert registry_of(image) == registry


def test_cost_before_after_delta_and_summary(created) -> None:
    assert holds(created, "cost.before == 0.0 && cost.after == 12.5 && cost.delta == 12.5")
    assert holds(created, "cost.after <= 20")  # a double compared with an int literal
    assert holds(created, "summary.add == 2 && summary.destroy == 0")
    assert holds(created, "plan.summary.add == 2 && size(plan.resource_changes) == 2")


def test_deleted_and_replaced_helpers_and_variables(volume_gone, volume_replaced) -> None:
    assert holds(volume_gone, "deleted('volume') == ['volume.data'] && replaced('*') == []")
    assert holds(volume_gone, "deletions.exists(d, d.kind == 'volume' && d.name == 'data')")
    assert holds(volume_gone, "created('service') == ['service.llm'] && updated('*') == []")
    assert holds(volume_gone, "changes.exists(c, c.action == 'delete' && c.after == null)")
    assert holds(volume_replaced, "replaced('volume') == ['volume.data'] && deleted('*') == []")
    assert holds(volume_replaced, "replacements.map(r, r.address) == ['volume.data']")


def test_deny_and_warn_outcomes(created) -> None:
    outcomes = check(
        created,
        rule("cost.after < 10.0", "warn", "cheap"),
        rule("gpus.total < 100.0", "deny", "gpus"),
    )
    assert outcomes == {"cheap": "fail", "gpus": "pass"}
    report = evaluate(parse_rules(rule("cost.after < 10.0", "warn"), "w.yml"), created)
    assert not report.denied and report.failed("warn")[0].message == "r failed"
    report = evaluate(parse_rules(rule("cost.after < 10.0", "deny"), "d.yml"), created)
    assert report.denied
    assert report.to_json() == {
        "rules": [
            {"name": "r", "file": "d.yml", "severity": "deny", "outcome": "fail",
             "message": "r failed"}
        ],
        "denied": True,
    }  # fmt: skip


def test_the_shipped_examples(created, volume_gone, volume_replaced, tmp_path: Path) -> None:
    def outcomes(document: dict[str, Any]) -> dict[str, str]:
        files = [(p, p.name) for p in sorted(EXAMPLES.glob("*.yml"))]
        return {r.name: r.outcome for r in evaluate(load_rules(files), document).rules}

    assert outcomes(created) == {
        "allowed-registries": "pass",
        "max-cost": "pass",
        "cost-jump": "pass",
        "max-gpus": "pass",
        "protect-volumes": "pass",
    }
    assert outcomes(volume_gone)["protect-volumes"] == "fail"
    assert outcomes(volume_replaced)["protect-volumes"] == "fail"
    big = desired_items(
        tmp_path / "big",
        TRAIN.replace("A100:4..8", "H100:8") + "---\n" + LLM.replace("ubuntu", "quay.io/x/y"),
    )
    made = plan(big, state_of([]), exists=False)
    expensive = plan_to_json(made.model_copy(update={"cost": Cost(before=10.0, after=60.0)}))
    assert outcomes(expensive) == {
        "allowed-registries": "fail",
        "max-cost": "fail",
        "cost-jump": "fail",
        "max-gpus": "fail",
        "protect-volumes": "pass",
    }


def test_a_missing_field_is_an_error_even_where_it_would_not_be_evaluated(created) -> None:
    empty = plan_to_json(Plan(lineage="", serial=0))
    for document in (created, empty):  # no runs: `all` would be vacuously true
        with pytest.raises(ConfigError) as caught:
            check(document, rule("runs.all(r, r.gpu <= 8)", name="max-gpus"))
        text = str(caught.value)
        assert "p0.yml:3:" in text and "rule 'max-gpus'" in text
        assert "has no field 'gpu'" in text and "gpus" in text
    for expression in (
        "true || cost.aftr > 1.0",
        "has(cost.aftr)",
        "plan.resource_changes.all(c, c.change.actons == [])",
        "nope == 1",
    ):
        with pytest.raises(ConfigError):
            check(created, rule(expression))


def test_a_missing_key_at_run_time_is_an_error_not_a_pass(created) -> None:
    # labels and specs hold the user's keys: checked when evaluated
    with pytest.raises(PolicyError, match=r"p0.yml:3: rule 'r' cannot be evaluated.*team"):
        check(created, rule("runs.all(r, r.labels.team == 'ml')"))
    with pytest.raises(PolicyError, match="must give true or false"):
        check(created, rule("cost.after"))


def test_a_syntax_error_names_the_file_line_and_column(created) -> None:
    with pytest.raises(ConfigError) as caught:
        check(created, rule("runs.all(r, r.gpus <= )"))
    assert str(caught.value).startswith("p0.yml:3:40: error: rule 'r': syntax error:")
    block = "rules:\n  - name: b\n    message: m\n    expression: |\n"
    block += "      cost.after > 1.0 &&\n        (\n"
    with pytest.raises(ConfigError, match=r"p0.yml:7:7: error: rule 'b': syntax error"):
        check(created, block)  # the end of the block: line 3 of the expression, indented 6
    missing = block.replace("&&\n        (\n", "&& cost.aftr > 2.0\n")
    with pytest.raises(ConfigError, match=r"p0.yml:5:32: error: rule 'b': cost \(cost\) has no"):
        check(created, missing)


def _conforms(value: Any, kind: Type, path: str) -> None:
    if kind is DYN:
        return
    if isinstance(kind, Scalar):
        python = {"string": str, "double": float, "int": int, "bool": bool}[kind.name]
        assert isinstance(value, python), (path, value)
    elif isinstance(kind, ListOf):
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            _conforms(item, kind.item, f"{path}[{i}]")
    elif isinstance(kind, MapOf):
        assert isinstance(value, dict), path
        for key, item in value.items():
            _conforms(item, kind.value, f"{path}.{key}")
    elif isinstance(kind, Record):
        assert isinstance(value, dict) and set(value) == set(kind.fields), (path, set(value))
        for key, item in value.items():
            _conforms(item, kind.fields[key], f"{path}.{key}")


def test_values_match_the_types_the_field_check_uses(created, volume_gone) -> None:
    for document in (created, volume_gone):
        values = plan_values(document)
        assert set(values) == set(VARIABLES)
        for name, kind in VARIABLES.items():
            _conforms(values[name], kind, name)


def test_the_rules_in_the_docs_evaluate(created, volume_gone) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "policies.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    assert len(blocks) == 2
    for document in (created, volume_gone):
        outcomes = check(document, *blocks)
        assert len(outcomes) == 6
    assert check(created, blocks[1])["team-label"] == "fail"  # llm has no team label
