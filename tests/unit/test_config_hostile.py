"""Hostile or broken YAML never breaks the tool: every input is accepted or rejected with a
located `FILE:LINE:COL: error:` and never an internal error (issue 11). How long the costly
ones take is measured by benchmarks/hostile_inputs.py, not here: a test does not depend on
how busy the machine is."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dstack_plan.cli.app import build_app
from dstack_plan.config import interpolation
from dstack_plan.config.loader import MESSAGE_LIMIT, load_project, load_text
from dstack_plan.config.yaml_limits import MAX_DEPTH, MAX_ISSUES
from dstack_plan.errors import ConfigError, ConfigIssue
from tests.infra.hostile_configs import (
    BOMBS,
    DUPLICATES,
    ERROR_AMONG_100000_ENTRIES,
    ERRORS_IN_5000_DOCUMENTS,
    LONG_INTERPOLATION,
    REFERENCE_ERRORS,
    WRONG_ITEMS,
)


def issues_of(text: str) -> list[ConfigIssue]:
    resources, issues = load_text(text, "f.dstack.yml")
    assert issues, f"accepted: {resources}"
    return issues


def only_issue(text: str) -> ConfigIssue:
    issues = issues_of(text)
    assert len(issues) == 1, [str(i) for i in issues]
    return issues[0]


def validate(tmp_path: Path, *args: str) -> tuple[int, str]:
    app = build_app(only="validate")
    result = CliRunner().invoke(app, ["validate", str(tmp_path), *args], env={"NO_COLOR": "1"})
    return result.exit_code, result.output


# --- internal errors become located config errors ------------------------------------------

INTERNAL_ERRORS = {
    "merge key at the top": (
        "type: task\n<<: {bogus_key: 1}\ncommands: [echo]\n",
        (2, 6),
        "unknown key 'bogus_key'",
    ),
    "merge key in resources": (
        "type: task\ncommands: [echo]\nresources: {<<: {bogus: 1}}\n",
        (3, 18),
        "unknown key 'bogus'",
    ),
    "bool tag on a non-bool": (
        'type: task\ncommands: [echo]\nenv: !!bool "maybe"\n',
        (3, 6),
        "'maybe' is not a valid !!bool",
    ),
    "seq tag on a mapping": ("type: task\ncommands: !!seq {a: 1}\n", (2, 11), "!!seq needs a"),
    "map tag on a sequence": ("!!map [1, 2]\n", (1, 1), "!!map needs a mapping"),
    "timestamp tag on a non-date": (
        "type: fleet\nnodes: !!timestamp not-a-date\n",
        (2, 8),
        "'not-a-date' is not a valid !!timestamp",
    ),
    "str tag on a sequence": ("type: task\ncommands: [echo]\nname: !!str [a]\n", (3, 7), ""),
    "int tag on a word": ("type: fleet\nnodes: !!int many\n", (2, 8), "not a valid !!int"),
    "recursive alias": ("type: task\ncommands: &c [echo, *c]\n", (2, 11), "contains it"),
}


@pytest.mark.parametrize(
    ("text", "where", "message"), INTERNAL_ERRORS.values(), ids=list(INTERNAL_ERRORS)
)
def test_broken_merge_keys_and_tags_are_located_errors(
    text: str, where: tuple[int, int], message: str
) -> None:
    issue = only_issue(text)
    assert (issue.line, issue.column) == where, str(issue)
    assert message in issue.message


@pytest.mark.parametrize("name", list(INTERNAL_ERRORS))
def test_validate_reports_them_without_a_traceback(tmp_path: Path, name: str) -> None:
    text, (line, column), _ = INTERNAL_ERRORS[name]
    (tmp_path / "f.dstack.yml").write_text(text)
    code, output = validate(tmp_path)
    assert code == 1, output
    assert output.startswith(f"f.dstack.yml:{line}:{column}: error: "), output
    assert "Traceback" not in output and "bug" not in output


# --- bounded answers (their times: benchmarks/hostile_inputs.py) ---------------------------------


@pytest.mark.parametrize("text", BOMBS.values(), ids=list(BOMBS))
def test_alias_bombs_are_refused_briefly(text: str) -> None:
    tracemalloc.start()
    try:
        issues = issues_of(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50_000_000
    assert len(issues) == 1
    assert "aliases expand this document to" in issues[0].message
    assert issues[0].line > 3 and len(str(issues[0])) < 300


def test_aliases_and_merge_keys_within_the_limit_still_work() -> None:
    text = (
        "type: task\nname: tt\ncommands: [echo]\n"
        "regions: &r [eu-west-1, eu-west-2]\n"
        "availability_zones: *r\n"
        "resources: {<<: {gpu: 24GB, disk: 200GB}, disk: 300GB}\n"
    )
    resources, issues = load_text(text, "f.dstack.yml")
    assert issues == []
    spec = resources[0].normalized
    assert spec["regions"] == spec["availability_zones"] == ["eu-west-1", "eu-west-2"]
    assert "300GB" in str(spec["resources"]["disk"])


def test_the_alias_limit_is_the_documented_one() -> None:
    items = ", ".join(["x"] * 100)

    def aliased(times: int) -> list[str]:
        aliases = ", ".join(["*a"] * times)
        text = f"type: task\ncommands: [echo]\nx-a: &a [{items}]\nx-b: [{aliases}]\n"
        return [i.message for i in issues_of(text)]

    assert aliased(90) == ["unknown key 'x-a'", "unknown key 'x-b'"]  # 9,300 nodes: always fine
    [message] = aliased(120)
    assert message.startswith("aliases expand this document to 12,230 nodes, more than allowed")


def test_a_long_unterminated_interpolation_is_one_issue() -> None:
    issues = issues_of(LONG_INTERPOLATION)
    assert [(i.line, i.message) for i in issues] == [
        (2, "unterminated interpolation: '${{' without a matching '}}'")
    ]


def test_interpolation_parsing_keeps_its_meaning() -> None:
    refs = interpolation.parse_references("${{ env.A }}-${{secrets.B}}")
    assert [str(r) for r in refs] == ["${{ env.A }}", "${{ secrets.B }}"]
    with pytest.raises(ValueError, match="unterminated"):
        interpolation.parse_references("${{ env.A }} ${{ env.B")
    with pytest.raises(ValueError, match="invalid name"):
        interpolation.parse_references("${{ env.A ${{ env.B }}")
    values = {"env": {"A": "1"}, "secrets": {"B": "2"}}
    assert interpolation.resolve("a${{ env.A }}b${{ secrets.B }}c", values) == "a1b2c"
    assert interpolation.resolve("${{ env.A }} ${{ x", values) == "1 ${{ x"


def test_an_error_among_100000_entries_is_located() -> None:
    issues = issues_of(ERROR_AMONG_100000_ENTRIES)
    assert [(i.line, i.column, i.message) for i in issues] == [(100_004, 1, "unknown key 'bogus'")]


def test_errors_in_5000_documents_report_the_first_ones() -> None:
    issues = issues_of(ERRORS_IN_5000_DOCUMENTS)
    assert [(i.line, i.message) for i in issues[:2]] == [
        (5, "unknown key 'bogus'"),
        (10, "unknown key 'bogus'"),
    ]
    assert len(issues) == MAX_ISSUES + 1
    assert "only the first 100 are reported" in issues[-1].message


def test_a_huge_list_of_wrong_items_is_reported_briefly() -> None:
    issues = issues_of(WRONG_ITEMS)
    assert (issues[0].line, issues[0].column) == (3, 5)
    assert len(issues) == MAX_ISSUES + 1


def test_error_messages_cut_long_values() -> None:
    text = "type: task\ncommands: [echo]\nname: " + "x" * 200_000 + "\n"
    issue = only_issue(text)
    assert (issue.line, issue.column) == (3, 7)
    assert len(issue.message) <= MESSAGE_LIMIT + 50
    assert "characters in all" in issue.message


# --- locations -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("type: task\ncommands:\n  - echo \x00hi\n", (3, 10), "control character U+0000"),
        ("type: task\ncommands:\n  - echo \x07\n", (3, 10), "control character U+0007"),
        ('type: task\nname: "é\x1b"\n', (2, 9), "control character U+001B"),
        ("type: task\ncommands: [echo]\n# \ufffe\n", (3, 3), "character U+FFFE"),
    ],
)
def test_bad_characters_are_reported_where_they_are(
    text: str, where: tuple[int, int], message: str
) -> None:
    issue = only_issue(text)
    assert (issue.line, issue.column) == where, str(issue)
    assert message in issue.message
    assert "position" not in issue.message and "<unicode string>" not in issue.message
    assert "\n" not in issue.message


def test_invalid_utf8_is_reported_where_it_is(tmp_path: Path) -> None:
    (tmp_path / "good.dstack.yml").write_text("type: task\nname: good\ncommands: [echo]\n")
    (tmp_path / "f.dstack.yml").write_bytes(b"type: task\ncommands:\n  - echo \xff\xfe\n")
    with pytest.raises(ConfigError) as caught:
        load_project(tmp_path)
    assert [str(i) for i in caught.value.issues] == [
        "f.dstack.yml:3:10: error: not UTF-8 text: invalid byte 0xFF"
    ]


def test_deep_nesting_keeps_every_error_in_place() -> None:
    depth = 300
    text = (
        "type: task\nname: BAD\ncommands: [echo]\n"
        f"bogus: {'[' * depth}{']' * depth}\n"
        "resources:\n" + "".join("  " * i + "a:\n" for i in range(1, depth))
    )
    issues = issues_of(text)
    assert sorted((i.line, i.column) for i in issues) == [(2, 7), (4, 1), (6, 3)]


def test_nesting_past_the_limit_is_refused_where_it_happens() -> None:
    depth = MAX_DEPTH + 10
    text = f"type: task\ncommands: [echo]\nbogus: {'[' * depth}{']' * depth}\n"
    issue = only_issue(text)
    assert (issue.line, issue.column) == (3, 8 + MAX_DEPTH - 1)
    assert f"more than {MAX_DEPTH} levels" in issue.message
    block = "type: task\ncommands: [echo]\nresources:\n" + "".join(
        " " * i + "a:\n" for i in range(1, depth)
    )
    issue = only_issue(block)
    assert issue.line > MAX_DEPTH and "levels" in issue.message


# --- duplicate keys and tabs -----------------------------------------------------------------


def test_a_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    (tmp_path / "train.dstack.yml").write_text(
        "type: task\nname: train\ncommands:\n  - python train.py\nresources:\n  gpu: 24GB\n"
        "commands:\n  - echo overridden\n"
    )
    code, output = validate(tmp_path)
    assert code == 1
    assert output.strip() == (
        "train.dstack.yml:7:1: error: duplicate key 'commands' (first at line 3)"
    )


def test_duplicate_keys_everywhere_are_reported_with_the_other_errors() -> None:
    text = (
        "type: task\nname: BAD\ncommands: [echo]\n"
        "resources:\n  gpu: 24GB\n  disk: 100GB\n  gpu: 80GB\n"
        "env: {A: 1, A: 2}\n"
    )
    assert sorted(str(i) for i in issues_of(text)) == sorted(
        [
            "f.dstack.yml:2:7: error: name: invalid name 'BAD': use 2-41 characters, lowercase "
            "letters, digits and '-', starting with a letter (dstack's server refuses other "
            "names too)",
            "f.dstack.yml:7:3: error: duplicate key 'gpu' (first at line 5)",
            "f.dstack.yml:8:13: error: duplicate key 'A' (first at line 8)",
        ]
    )


def test_merge_keys_may_be_overridden_but_written_keys_not_repeated() -> None:
    base = "type: task\nname: tt\ncommands: [echo]\nresources: {<<: {disk: 1TB}, disk: 200GB}\n"
    assert load_text(base, "f.dstack.yml")[1] == []
    issue = only_issue(base.replace("disk: 200GB}", "disk: 200GB, disk: 300GB}"))
    assert str(issue) == "f.dstack.yml:4:43: error: duplicate key 'disk' (first at line 4)"


def test_the_same_key_in_two_documents_is_no_duplicate() -> None:
    text = "type: task\nname: aa\ncommands: [echo]\n---\ntype: task\nname: bb\ncommands: [echo]\n"
    resources, issues = load_text(text, "f.dstack.yml")
    assert issues == [] and [r.address for r in resources] == ["task.aa", "task.bb"]


def test_so_many_duplicates_are_reported_briefly() -> None:
    issues = issues_of(DUPLICATES)
    assert str(issues[0]) == "f.dstack.yml:5:3: error: duplicate key 'A' (first at line 4)"
    assert len(issues) == MAX_ISSUES + 1


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("type: task\ncommands:\n\t- echo\n", (3, 1)),
        ("type: task\nresources:\n  gpu: 24GB\n\tdisk: 1TB\n", (4, 1)),
        ("type: task\ncommands:\n  - a\n \t- b\n", (4, 2)),
        ("\ttype: task\n", (1, 1)),
    ],
)
def test_a_tab_used_for_indentation_says_so(text: str, where: tuple[int, int]) -> None:
    issue = only_issue(text)
    assert (issue.line, issue.column, issue.message) == (
        *where,
        "tabs are not allowed for indentation in YAML",
    )


def test_a_tab_inside_a_line_is_fine() -> None:
    assert load_text("type: task\nname:\ttt\ncommands: [echo]\t# c\n", "f")[1] == []


# --- one bad file never costs the others their results ---------------------------------------


def test_every_file_is_checked_whatever_the_others_hold(tmp_path: Path) -> None:
    (tmp_path / "good.dstack.yml").write_text("type: task\nname: good\ncommands: [echo]\n")
    (tmp_path / "syntax.dstack.yml").write_text("type: task\nname: [oops\n")
    (tmp_path / "schema.dstack.yml").write_text("type: task\nname: ss\ncommands: [echo]\nx: 1\n")
    (tmp_path / "tags.dstack.yml").write_text("!!map [1, 2]\n")
    (tmp_path / "bytes.dstack.yml").write_bytes(b"type: task\nname: \xc3\n")
    (tmp_path / "dir.dstack.yml").mkdir()
    (tmp_path / "dup.dstack.yml").write_text("type: task\nname: good\ncommands: [echo]\n")
    names = ["good", "syntax", "schema", "tags", "bytes", "dir", "missing", "dup"]
    files = [a for n in names for a in ("-f", str(tmp_path / f"{n}.dstack.yml"))]
    code, output = validate(tmp_path, *files)
    assert code == 1
    lines = output.strip().splitlines()
    assert [line.split(": error: ")[0] for line in lines] == [
        "bytes.dstack.yml:2:7",
        "dir.dstack.yml:1:1",
        "dup.dstack.yml:2:7",  # the good file was loaded: its resource is a duplicate here
        "missing.dstack.yml:1:1",
        "schema.dstack.yml:4:1",
        "syntax.dstack.yml:3:1",
        "tags.dstack.yml:1:1",
    ], output
    assert "Traceback" not in output


def test_thousands_of_reference_errors_in_one_file_are_located(tmp_path: Path) -> None:
    (tmp_path / "runs.dstack.yml").write_text(REFERENCE_ERRORS)
    code, output = validate(tmp_path)
    assert code == 1
    lines = output.splitlines()
    assert (
        lines[0]
        == "runs.dstack.yml:5:1: error: task.t0 refers to fleet.nope, which is not declared"
    )
    assert lines[-1].startswith("runs.dstack.yml:25000:1: error: task.t4999 refers")
