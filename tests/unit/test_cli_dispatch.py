"""The console script builds only the command it runs; what a user sees must not change."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dstack_plan.cli.app import build_app, invoked_command

COMMANDS = ["validate", "plan", "apply", "destroy", "schema", "init", "ps", "logs", "stop"]
COMMANDS += ["graph", "state", "namespace"]


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["plan"], "plan"),
        (["plan", "--help"], "plan"),
        (["--debug", "--no-color", "apply", "-y"], "apply"),
        (["--log-level", "debug", "--log-format=json", "ps"], "ps"),
        (["--log-level=info", "state", "list"], "state"),
        (["namespace", "create", "dev"], "namespace"),
        # the whole app: to list the commands, or to name the ones that exist
        ([], None),
        (["--help"], None),
        (["--help", "plan"], None),
        (["--unknown", "plan"], None),
        (["plna"], None),
        (["--log-level"], None),
    ],
)
def test_invoked_command_is_found_behind_global_options_only(
    args: list[str], command: str | None
) -> None:
    assert invoked_command(args) == command


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_alone_behaves_as_in_the_whole_app(command: str) -> None:
    runner = CliRunner()
    whole = runner.invoke(build_app(), [command, "--help"], env={"NO_COLOR": "1"})
    alone = runner.invoke(build_app(only=command), [command, "--help"], env={"NO_COLOR": "1"})
    assert whole.exit_code == alone.exit_code == 0
    assert alone.stdout == whole.stdout
    assert f"Usage: dstack {command}" in alone.stdout


def test_the_whole_app_lists_every_command_and_rejects_unknown_ones() -> None:
    runner = CliRunner()
    listing = runner.invoke(build_app(), ["--help"], env={"NO_COLOR": "1"})
    assert listing.exit_code == 0
    listed = [line.split()[0] for line in listing.stdout.splitlines() if line.startswith("  ")]
    assert [c for c in listed if c in COMMANDS] == COMMANDS
    unknown = runner.invoke(build_app(), ["plna"], env={"NO_COLOR": "1"})
    assert unknown.exit_code == 1
    assert "No such command" in unknown.output
