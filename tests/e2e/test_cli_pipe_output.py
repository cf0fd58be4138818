"""What the CLI prints as a user sees it: tables in whole rows into a pipe (wrapped between
words only on a terminal), a failed apply's error once on stderr, and Ctrl-C while planning
said in one line on stderr (exit 130, state untouched)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncssh
import pytest

from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import wait_for_status

NAME = "pipe-output-run-with-a-forty-char-name-x"
TASK = f"""\
type: task
name: {NAME}
commands: ["sleep 600"]
stop_duration: 1s
resources: {{cpu: 1.., memory: 0.1GB.., disk: 1GB..}}
"""
QUICK = """\
type: task
name: quick
commands: ["true"]
resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}
"""
FLEET = """\
type: fleet
name: far
ssh_config:
  user: ubuntu
  identity_file: {key}
  hosts:
    - hostname: 127.0.0.1
      port: {port}
"""
PS_HEADERS = ["NAME", "STATUS", "FLEET", "HOSTS", "PORTS", "GPU", "PRICE", "AGE"]
OFFER_HEADERS = ["#", "FLEET", "HOST", "RESOURCES", "PRICE", "AVAILABILITY"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def running_task(dstack: Dstack, cli_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A task with a 40-character name running on the local fleet; COLUMNS unset."""
    assert len(NAME) == 40
    cli_env.pop("COLUMNS", None)
    (tmp_path / "project" / "long.dstack.yml").write_text(TASK)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, f"task.{NAME}", {"running"})
    yield f"task.{NAME}"
    dstack("destroy", "-y")


def test_ps_and_offer_print_whole_rows_into_a_pipe(
    dstack: Dstack, cli_env: dict[str, str], running_task: str
) -> None:
    for columns in (None, "50"):  # COLUMNS says how wide a terminal is, not a pipe
        if columns is not None:
            cli_env["COLUMNS"] = columns
        listed = dstack("ps")
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split() == PS_HEADERS, listed.stdout
        assert len(lines) == 2, listed.stdout  # one line a row: nothing wrapped
        row = lines[1]
        assert len(row) > 80
        cells = row.split()  # every cell whole, the AGE last
        assert cells[:7] == [running_task, "running", "local", "vm", "-", "-", "$0.00/h"], row
        assert len(cells) == len(PS_HEADERS) and row == row.rstrip()

        offered = dstack("offer", "--cpu", "1..", "--memory", "0.1GB..", "--disk", "1GB..")
        assert offered.returncode == 0, offered.stderr
        lines = offered.stdout.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("#"))
        assert lines[header].split() == OFFER_HEADERS, offered.stdout
        row = lines[header + 1]
        assert row.split()[:3] == ["1", "local", "vm"], offered.stdout
        assert row.endswith(f"(runs {running_task})"), offered.stdout  # AVAILABILITY, whole
        assert len(row) > 80
        assert not lines[header + 2 :] or lines[header + 2].startswith("Note:"), offered.stdout


def test_on_a_terminal_tables_wrap_between_words_within_columns(
    cli_env: dict[str, str], running_task: str, tmp_path: Path
) -> None:
    offered = _on_a_terminal(
        cli_env, tmp_path / "project", "offer", "--cpu", "1..", columns=100
    ).splitlines()
    header = next(i for i, line in enumerate(offered) if line.startswith("#"))
    assert offered[header].split() == OFFER_HEADERS
    assert all(len(line) <= 100 for line in offered[header:]), offered
    # AVAILABILITY wraps between its words: the run's name stays whole on its own line
    assert offered[header + 1].split()[:3] == ["1", "local", "vm"]
    assert offered[header + 2].strip() == f"{running_task})", offered

    # too narrow for whole cells: the row runs past the edge, nothing cut or dropped
    listed = _on_a_terminal(cli_env, tmp_path / "project", "ps", columns=60).splitlines()
    assert listed[0].split() == PS_HEADERS, listed
    assert listed[1].split()[:4] == [running_task, "running", "local", "vm"], listed
    assert len(listed) == 2


def test_a_failed_apply_says_its_error_once_on_stderr(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused
        port = closed.getsockname()[1]
        (project / "far.dstack.yml").write_text(FLEET.format(key=_key(tmp_path), port=port))
        planned = dstack("plan")
        assert planned.returncode == 0, planned.stdout + planned.stderr  # it fails at apply
        applied = dstack("apply", "-y")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    error = f"connection to 127.0.0.1:{port} refused"
    output = applied.stdout + applied.stderr
    assert output.count(error) == 1, output
    assert f"fleet.far: ssh: 1 of 1 host(s) failed: 127.0.0.1:{port}: {error}" in applied.stderr
    assert "fleet.far: Creating..." in applied.stdout
    assert "Error:" not in output
    assert applied.stdout.splitlines()[-1] == (
        "Apply failed: 0 added, 0 changed, 0 destroyed, 1 failed, 0 skipped."
    )


@pytest.mark.parametrize("command", [["plan"], ["apply", "-y"], ["apply"]])
def test_ctrl_c_while_planning_says_nothing_was_changed_and_exits_130(
    dstack: Dstack, cli_env: dict[str, str], tmp_path: Path, command: list[str]
) -> None:
    project = tmp_path / "project"
    (project / "quick.dstack.yml").write_text(QUICK)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    state = project / ".dstack" / "state.json"
    before = state.read_bytes()
    with _silent_server() as (port, accepted):
        (project / "far.dstack.yml").write_text(FLEET.format(key=_key(tmp_path), port=port))
        process = subprocess.Popen(
            [*CLI, *command],
            cwd=project,
            env=cli_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # the plan asks the host and waits for an answer that never comes
            assert accepted.wait(timeout=60), "the plan never connected to the fleet's host"
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 130, out + err
    assert err.splitlines().count("Interrupted: nothing was changed.") == 1, err
    assert "Traceback" not in err and "Apply" not in out
    assert state.read_bytes() == before


def _key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    if not path.exists():
        asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(path))
    return path


@contextmanager
def _silent_server() -> Iterator[tuple[int, threading.Event]]:
    """A TCP server on 127.0.0.1 that accepts connections and never says a word: an SSH
    client waits there for the server's greeting. Yields its port and an event set once it
    accepted a connection."""
    accepted = threading.Event()
    held: list[socket.socket] = []
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            held.append(conn)
            accepted.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        server.close()
        for conn in held:
            conn.close()


def _on_a_terminal(cli_env: dict[str, str], project: Path, *args: str, columns: int) -> str:
    """What `dstack ARGS...` shows with stdout a terminal COLUMNS wide (ANSI codes removed)."""
    master, slave = os.openpty()
    process = subprocess.Popen(
        [*CLI, *args],
        cwd=project,
        env={**cli_env, "COLUMNS": str(columns)},
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=120) == 0, process.stderr.read() if process.stderr else ""
    finally:
        os.close(master)
        if process.stderr:
            process.stderr.close()
    return ANSI.sub("", b"".join(chunks).decode().replace("\r\n", "\n"))
