"""`.dstack/quotas.yml`: its model, every error located, round-trip edits, `namespace:` on runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dstack_plan.config import quotas_edit as edits
from dstack_plan.config.loader import load_text
from dstack_plan.config.quotas import (
    QUOTAS_FILE,
    Limits,
    NamespaceQuota,
    Quotas,
    load_quotas,
    namespace_of,
    parse_quotas,
    save_quotas,
)
from dstack_plan.errors import ConfigError, DstackPlanError

EXAMPLE = """\
namespaces:
  dev:
    gpus: 20
    gpu_hours_per_day: 100
    per_user: {gpus: 4, gpu_hours_per_day: 24}
    users:
      alice: {gpu_hours_per_day: 48}
  prod: {gpus: 50, cost_per_hour: 200}
"""


def test_the_documented_example_reads_as_written() -> None:
    quotas = parse_quotas(EXAMPLE)
    dev = quotas.for_namespace("dev")
    assert dev == NamespaceQuota(
        gpus=20,
        gpu_hours_per_day=100,
        per_user=Limits(gpus=4, gpu_hours_per_day=24),
        users={"alice": Limits(gpu_hours_per_day=48)},
    )
    assert quotas.for_namespace("prod") == NamespaceQuota(gpus=50, cost_per_hour=200)
    assert quotas.for_namespace("default") is None


def test_a_users_own_limits_replace_per_user_whole() -> None:
    dev = parse_quotas(EXAMPLE).namespaces["dev"]
    assert dev.for_user("alice") == Limits(gpu_hours_per_day=48)  # no gpus limit for alice
    assert dev.for_user("bob") == Limits(gpus=4, gpu_hours_per_day=24)
    assert parse_quotas(EXAMPLE).namespaces["prod"].for_user("bob") is None


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "namespaces:\n", "namespaces: {}\n"])
def test_an_empty_file_has_no_quotas(text: str) -> None:
    assert parse_quotas(text) == Quotas()


def test_a_missing_file_has_no_quotas(tmp_path: Path) -> None:
    assert load_quotas(tmp_path) == Quotas()


def test_zero_is_a_limit_and_fractions_are_allowed() -> None:
    quotas = parse_quotas("namespaces:\n  dev: {gpus: 0, cost_per_hour: 0.5}\n")
    assert quotas.namespaces["dev"] == NamespaceQuota(gpus=0.0, cost_per_hour=0.5)


BAD = [
    ("namespaces:\n  Dev:\n    gpus: 2\n", 2, 3, "namespaces.Dev: invalid name 'Dev'"),
    ("namespaces: {ab: {}, x: {gpus: 1}}\n", 1, 22, "namespaces.x: invalid name 'x'"),
    ("namespaces:\n  dev:\n    gpus: -1\n", 3, 11, "namespaces.dev.gpus: must be at least 0"),
    ("namespaces:\n  dev:\n    gpu: 2\n", 3, 5, "unknown key 'gpu' (did you mean 'gpus'?)"),
    ("namespaces:\n  dev:\n    gpus: true\n", 3, 11, "gpus: expected a number, got true"),
    ('namespaces:\n  dev: {gpus: "20"}\n', 2, 15, "gpus: expected a number, got '20'"),
    ("namespaces:\n  dev:\n    gpus: .inf\n", 3, 11, "expected a finite number"),
    ("namespaces:\n  dev: 4\n", 2, 8, "namespaces.dev: expected a mapping"),
    ("namespaces: [a]\n", 1, 13, "namespaces: expected a mapping, got a list"),
    ("namespace: {}\n", 1, 1, "unknown key 'namespace' (did you mean 'namespaces'?)"),
    ("- a\n", 1, 1, "expected a mapping with a 'namespaces' key"),
    ("a: b: c\n", 1, 5, "invalid YAML: mapping values are not allowed"),
    ("namespaces:\n  dev:\n    gpus: 1\n    gpus: 2\n", 4, 5, "duplicate key 'gpus'"),
    ("---\nnamespaces: {}\n---\nnamespaces: {}\n", 1, 1, "expected one YAML document"),
    (
        "namespaces:\n  dev:\n    per_user: {gpus: 4, hours: 2}\n",
        3,
        25,
        "unknown key 'hours'",
    ),
    (
        "namespaces:\n  dev:\n    users:\n      '-x': {gpus: 1}\n",
        4,
        7,
        "namespaces.dev.users.-x: invalid user name '-x'",
    ),
    (
        "namespaces:\n  dev:\n    users:\n      alice: {gpus: -2}\n",
        4,
        21,
        "namespaces.dev.users.alice.gpus: must be at least 0, got -2",
    ),
]


@pytest.mark.parametrize(("text", "line", "column", "message"), BAD)
def test_every_error_is_located(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_quotas(text)
    first = raised.value.issues[0]
    assert (first.file, first.line, first.column) == (QUOTAS_FILE, line, column)
    assert message in first.message
    assert str(raised.value).startswith(f"{QUOTAS_FILE}:{line}:{column}: error: ")


def test_a_broken_file_in_a_project_is_a_located_config_error(tmp_path: Path) -> None:
    (tmp_path / ".dstack").mkdir()
    (tmp_path / QUOTAS_FILE).write_text("namespaces:\n  dev:\n    gpus: lots\n")
    with pytest.raises(ConfigError, match=r"^\.dstack/quotas\.yml:3:11: error: "):
        load_quotas(tmp_path)


# --- namespace: on runs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("task", "commands: [x]"),
        ("service", "port: 80\ncommands: [x]"),
        ("dev-environment", "ide: vscode"),
    ],
)
def test_every_run_kind_takes_a_namespace(kind: str, body: str) -> None:
    text = f"type: {kind}\nname: r1\n{body}\nnamespace: dev\n"
    (resource,), issues = load_text(text, "r.dstack.yml")
    assert issues == []
    assert resource.normalized["namespace"] == "dev"
    assert namespace_of(resource.normalized) == "dev"


@pytest.mark.parametrize("line", ["", "namespace: default\n", "namespace: null\n"])
def test_the_default_namespace_stays_out_of_the_normalised_spec(line: str) -> None:
    # so that states written before namespaces existed plan as a no-op
    (resource,), issues = load_text(f"type: task\ncommands: [x]\n{line}", "r.dstack.yml")
    assert issues == []
    assert "namespace" not in resource.normalized
    assert namespace_of(resource.normalized) == "default"


def test_a_bad_namespace_is_located() -> None:
    _, issues = load_text("type: task\ncommands: [x]\nnamespace: Dev\n", "r.dstack.yml")
    assert [str(i) for i in issues] == [
        "r.dstack.yml:3:12: error: namespace: invalid name 'Dev': use 2-41 characters, "
        "lowercase letters, digits and '-', starting with a letter"
    ]


# --- round-trip edits ------------------------------------------------------------------------


def test_edits_keep_the_users_comments_and_layout(tmp_path: Path) -> None:
    (tmp_path / ".dstack").mkdir()
    path = tmp_path / QUOTAS_FILE
    commented = EXAMPLE.replace("    gpus: 20\n", "    gpus: 20  # agreed in March\n")
    path.write_text("# team quotas\n" + commented + "# end\n")
    save_quotas(tmp_path, edits.set_limits("prod", {"gpus": 60}))
    save_quotas(tmp_path, edits.set_limits("dev", {"gpus": 2}, user="bob"))
    text = path.read_text()
    assert text.startswith("# team quotas\nnamespaces:\n  dev:\n    gpus: 20  # agreed in March\n")
    assert "  prod: {gpus: 60, cost_per_hour: 200}\n" in text
    assert text.endswith("# end\n")
    quotas = load_quotas(tmp_path)
    assert quotas.namespaces["dev"].users["bob"] == Limits(gpus=2)
    assert quotas.namespaces["dev"].users["alice"] == Limits(gpu_hours_per_day=48)


def test_create_set_clear_and_delete(tmp_path: Path) -> None:
    quotas = save_quotas(tmp_path, edits.create_namespace("dev", {"gpus": 20}))
    assert quotas.namespaces["dev"] == NamespaceQuota(gpus=20)
    assert (tmp_path / QUOTAS_FILE).read_text() == "namespaces:\n  dev:\n    gpus: 20\n"
    save_quotas(tmp_path, edits.set_limits("dev", {"gpus": None, "cost_per_hour": 1.5}))
    save_quotas(tmp_path, edits.set_limits("dev", {"gpus": 4}, per_user=True))
    quotas = save_quotas(tmp_path, edits.set_limits("dev", {"gpus": 8}, user="alice"))
    assert quotas.namespaces["dev"] == NamespaceQuota(
        cost_per_hour=1.5, per_user=Limits(gpus=4), users={"alice": Limits(gpus=8)}
    )
    quotas = save_quotas(tmp_path, edits.clear_limits("dev", user="alice"))
    assert quotas.namespaces["dev"].for_user("alice") == Limits(gpus=4)
    quotas = save_quotas(tmp_path, edits.clear_limits("dev"))
    assert quotas.namespaces["dev"] == NamespaceQuota(cost_per_hour=1.5)
    assert save_quotas(tmp_path, edits.delete_namespace("dev")) == Quotas()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda: edits.create_namespace("dev", {}), "namespace 'dev' exists already"),
        (lambda: edits.set_limits("qa", {"gpus": 1}), "no namespace 'qa' in .dstack/quotas.yml"),
        (lambda: edits.delete_namespace("qa"), "no namespace 'qa'"),
        (lambda: edits.create_namespace("QA", {}), "invalid namespace name 'QA'"),
        (lambda: edits.set_limits("dev", {}, user="-x"), "invalid user name '-x'"),
    ],
)
def test_bad_edits_are_refused_and_nothing_is_written(
    tmp_path: Path, edit: object, message: str
) -> None:
    save_quotas(tmp_path, edits.create_namespace("dev", {"gpus": 20}))
    before = (tmp_path / QUOTAS_FILE).read_text()
    with pytest.raises(DstackPlanError, match=message):
        save_quotas(tmp_path, edit())  # type: ignore[operator]
    assert (tmp_path / QUOTAS_FILE).read_text() == before


def test_a_broken_file_is_not_edited(tmp_path: Path) -> None:
    (tmp_path / ".dstack").mkdir()
    (tmp_path / QUOTAS_FILE).write_text("namespaces:\n  dev: {gpus: -1}\n")
    with pytest.raises(ConfigError, match=r"quotas\.yml:2:15"):
        save_quotas(tmp_path, edits.set_limits("dev", {"gpus": 1}))


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["gpu=20"], {"gpus": 20}),
        (["gpus=0.5", "gpu_hours_per_day=100"], {"gpus": 0.5, "gpu_hours_per_day": 100}),
        (["cost-per-hour=50", "gpu_hours=none"], {"cost_per_hour": 50, "gpu_hours_per_day": None}),
        (["GPUS=0"], {"gpus": 0}),
    ],
)
def test_limits_parse(items: list[str], expected: dict[str, float | None]) -> None:
    assert edits.parse_limits(items, "--quota") == expected


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("gpu", "--quota 'gpu': expected KEY=VALUE"),
        ("gpu=", "expected KEY=VALUE"),
        ("tpus=2", "unknown limit 'tpus' (one of: gpus, gpu_hours_per_day, cost_per_hour)"),
        ("gpus=-1", "expected a number >= 0"),
        ("gpus=lots", "expected a number >= 0"),
        ("gpus=nan", "expected a number >= 0"),
        ("gpus=inf", "expected a number >= 0"),
    ],
)
def test_bad_limits_are_refused(item: str, message: str) -> None:
    with pytest.raises(DstackPlanError, match=re.escape(message)):
        edits.parse_limits([item], "--quota")


def test_a_limit_given_twice_is_refused() -> None:
    with pytest.raises(DstackPlanError, match="gpus is given twice"):
        edits.parse_limits(["gpu=1", "gpus=2"], "--quota")
