"""The ways to run watch that examples/ gives use options `dstack watch` really has."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from typer.testing import CliRunner

from dstack_plan.cli.app import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_systemd_unit_runs_watch_with_options_it_accepts() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(EXAMPLES / "systemd" / "dstack-watch.service")
    words = shlex.split(unit["Service"]["ExecStart"])
    assert words[0].endswith("/dstack") and "watch" in words
    assert unit["Service"]["KillSignal"] == "SIGINT"  # a clean stop for watch
    watch_args = words[words.index("watch") + 1 :]
    help_text = CliRunner().invoke(app, ["watch", "--help"], env={"COLUMNS": "200"}).stdout
    for option in (w for w in watch_args if w.startswith("--")):
        assert option in help_text, option
    global_args = words[1 : words.index("watch")]
    top_help = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    for option in (w for w in global_args if w.startswith("--")):
        assert option in top_help, option
