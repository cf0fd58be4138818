"""Reading policy files: located errors (FILE:LINE:COL) and which files are found."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.errors import ConfigError
from dstack_plan.policy.loader import load_rules, parse_rules, policy_paths

GOOD = "rules:\n  - name: a\n    expression: 'true'\n    message: m\n"


def error(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_rules(text, "p.yml")
    return str(caught.value)


def test_a_good_file() -> None:
    (loaded,) = parse_rules(GOOD + "    severity: warn\n", "p.yml")
    assert (loaded.rule.name, loaded.rule.severity, loaded.file) == ("a", "warn", "p.yml")
    assert (loaded.where.line, loaded.where.column) == (3, 18)
    assert parse_rules(GOOD, "p.yml")[0].rule.severity == "deny"  # the default


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("message: m", "mesage: m"), "p.yml:4:5: error: unknown key 'mesage'"),
        (GOOD + "    severity: block\n", "p.yml:5:15: error: rules.0.severity: expected"),
        (
            GOOD.replace("    message: m\n", ""),
            "p.yml:2:5: error: rules.0: missing required key 'message'",
        ),
        (GOOD + GOOD.replace("rules:\n", ""), "p.yml:5:11: error: duplicate rule name 'a'"),
        ("rules: [a: b: c]\n", "p.yml:1:"),
        ("", "p.yml:1:1: error: expected one YAML document, got none"),
        ("- 1\n", "p.yml:1:1: error: expected a mapping with a 'rules' key"),
        ("rules: []\n", "p.yml:1:8: error: rules: must not be empty"),
        (GOOD + "extra: 1\n", "p.yml:5:1: error: unknown key 'extra'"),
    ],
)
def test_errors_are_located(text: str, expected: str) -> None:
    assert expected in error(text)


def test_every_file_s_problems_are_reported_at_once(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("rules: []\n")
    (tmp_path / "b.yml").write_text(GOOD.replace("message", "msg"))
    with pytest.raises(ConfigError) as caught:
        load_rules([(tmp_path / "a.yml", "a.yml"), (tmp_path / "b.yml", "b.yml"),
                    (tmp_path / "gone.yml", "gone.yml")])  # fmt: skip
    text = str(caught.value)
    assert "a.yml:1:8" in text and "b.yml:4:5" in text
    assert "gone.yml:1:1: error: cannot read policy file" in text


def test_policy_paths_takes_the_given_files_then_the_project_s(tmp_path: Path) -> None:
    assert policy_paths(tmp_path) == []
    folder = tmp_path / ".dstack" / "policies"
    folder.mkdir(parents=True)
    for name in ("b.yml", "a.yaml", "notes.txt"):
        (folder / name).write_text(GOOD)
    extra = tmp_path / "ci.yml"
    extra.write_text(GOOD)
    given = [str(extra), str(folder / "b.yml")]  # b.yml named twice: checked once
    assert [d for _, d in policy_paths(tmp_path, given)] == [
        str(extra),
        str(folder / "b.yml"),
        ".dstack/policies/a.yaml",
    ]
