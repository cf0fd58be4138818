"""Printing lines: plain text for pipes and NO_COLOR, styles only for terminals; user text is
never read as markup."""

from __future__ import annotations

import io

import pytest

from dstack_plan.cli.output import print_lines
from dstack_plan.plan.lines import Line, styled

LINES: list[Line] = [
    (styled("+", "green"), " create"),
    "  value = [bold]not markup[/]",
    '  commands = ["echo :rocket:"]',
    (styled("Plan: 1 to add.", "bold"),),
]
PLAIN = (
    '+ create\n  value = [bold]not markup[/]\n  commands = ["echo :rocket:"]\nPlan: 1 to add.\n'
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def no_colour_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)


def test_a_pipe_gets_the_text_without_styles(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    print_lines(LINES)
    assert out.getvalue() == PLAIN


def test_a_terminal_gets_styles_unless_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Terminal()
    monkeypatch.setattr("sys.stdout", out)
    print_lines(LINES)
    styled_text = out.getvalue()
    assert "\x1b[" in styled_text and "[bold]not markup[/]" in styled_text
    assert "echo :rocket:" in styled_text  # user text as written: no markup, no emoji
    out.seek(0)
    out.truncate()
    monkeypatch.setenv("NO_COLOR", "1")
    print_lines(LINES)
    assert out.getvalue() == PLAIN


def test_force_color_styles_a_pipe_too(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setenv("FORCE_COLOR", "1")
    print_lines(LINES, stderr=True)
    assert "\x1b[" in err.getvalue()
