"""`output.whole_rows`: tables in whole rows into a pipe, and on a terminal wrapped between
words only, never cutting a name, a status or an address."""

from __future__ import annotations

import io

import pytest
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from dstack_plan.cli.output import print_table, whole_rows

NAME = "task.a-forty-character-run-name-for-tests"
HOSTS = "10.20.30.41, 10.20.30.42, 10.20.30.43"
HEADERS = ["NAME", "STATUS", "FLEET", "HOSTS", "PRICE", "NOTE"]
NOTE = "retrying at 12:00 after the host 10.20.30.41 went away"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _table() -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in HEADERS:
        table.add_column(header, no_wrap=header not in ("HOSTS", "NOTE"))
    table.add_row(NAME, "running", "on-prem-gpus", HOSTS, "$1.20/h", NOTE)
    table.add_row("task.short", "terminating", "local", "vm", "$0.00/h", "")
    return table


def _printed(file: io.StringIO, renderable: object, width: int) -> list[str]:
    console = Console(file=file, width=width, soft_wrap=True, color_system=None, highlight=False)
    console.print(whole_rows(renderable))
    return file.getvalue().splitlines()


@pytest.mark.parametrize("width", [40, 80, 200])
def test_into_a_pipe_every_row_is_one_whole_line_whatever_the_width(width: int) -> None:
    lines = _printed(io.StringIO(), _table(), width)
    assert len(lines) == 3
    assert lines[0].split() == HEADERS
    assert lines[1].split() == [
        NAME,
        "running",
        "on-prem-gpus",
        *HOSTS.split(),
        "$1.20/h",
        *NOTE.split(),
    ]
    assert lines[2].split() == ["task.short", "terminating", "local", "vm", "$0.00/h"]
    assert all(line == line.rstrip() for line in lines)


def test_on_a_wide_terminal_the_table_is_as_in_a_pipe() -> None:
    assert _printed(_Terminal(), _table(), 300) == _printed(io.StringIO(), _table(), 300)


@pytest.mark.parametrize("width", [60, 90, 120])
def test_on_a_narrow_terminal_cells_wrap_between_words_and_stay_whole(width: int) -> None:
    lines = _printed(_Terminal(), _table(), width)
    text = "\n".join(lines)
    assert lines[0].split() == HEADERS  # no column dropped, no header folded
    for whole in (NAME, "running", "terminating", "on-prem-gpus", "$1.20/h", "10.20.30.43"):
        assert whole in text, text
    assert "10.20.30.41," in text and "10.20.30.42," in text
    words = text.split()
    assert [w for w in NOTE.split() if w not in words] == []  # the note's words, none cut
    # each column as wide as its widest cell (no_wrap) or longest word, 2 blanks between
    least = [NAME, "terminating", "on-prem-gpus", "10.20.30.41,", "$1.20/h", "10.20.30.41"]
    narrowest = sum(len(cell) for cell in least) + 2 * (len(least) - 1)
    assert max(len(line) for line in lines) <= max(width, narrowest)


def test_on_a_terminal_too_narrow_for_whole_cells_the_rows_run_past_its_edge() -> None:
    lines = _printed(_Terminal(), _table(), 30)
    assert lines[0].split() == HEADERS
    assert lines[1].split()[:3] == [NAME, "running", "on-prem-gpus"]
    assert max(len(line) for line in lines) > 30


def test_a_group_lays_out_its_tables_and_leaves_its_lines_alone() -> None:
    group = Group(Text("Machines for cpu=2.."), _table(), Text(f"! {NAME} failed: {NOTE}"))
    lines = _printed(io.StringIO(), group, 40)
    assert lines[0] == "Machines for cpu=2.."
    assert lines[2].startswith(NAME) and lines[-1] == f"! {NAME} failed: {NOTE}"
    assert len(lines) == 5


def test_print_table_prints_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(_table())
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == HEADERS and out[1].split()[:2] == [NAME, "running"]
