"""The agent's systemd unit: its name, its text and the quoting of every path in it.

`systemd-analyze verify` (where installed) checks the unit as systemd itself parses it: an
ExecStart program it cannot find, or a `%` it takes for a specifier, is an error there.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dstack_plan.providers.ssh.systemd import (
    AgentUnit,
    SystemdFacts,
    quote_exec,
    quote_value,
    unit_name,
    unit_text,
)

WEIRD = 'we ird $HOME %n "q" \\ \'s'
"""A directory name with everything systemd or a shell would otherwise read into."""
PROGRAM_DIR = "py thon $HOME %n"
"""What systemd allows in a program's path (no quotes, no backslashes)."""

ROOT_FACTS = SystemdFacts(
    uid=0, root="", python="/usr/bin/python3", path="/usr/bin:/bin", home="/root", linger=False
)


def test_unit_names_keep_what_systemd_allows_and_escape_the_rest() -> None:
    assert unit_name("gpu-1.lab") == "dstack-plan-agent-gpu-1.lab.service"
    assert unit_name("a b/ü") == "dstack-plan-agent-a\\x20b\\x2f\\xc3\\xbc.service"


def test_values_are_double_quoted_with_backslash_quote_and_percent_escaped() -> None:
    assert quote_value('PATH=/a b/"x"\\%i') == '"PATH=/a b/\\"x\\"\\\\%%i"'
    with pytest.raises(ValueError, match="control character"):
        quote_value("a\nb")


def test_exec_lines_double_dollars_in_arguments_only() -> None:
    # systemd substitutes $VAR in arguments but takes the program literally
    assert quote_exec(["/opt/$x/python3", "-c", "$x %h"]) == ('"/opt/$x/python3" "-c" "$$x %%h"')
    with pytest.raises(ValueError, match="absolute path"):
        quote_exec(["python3", "-I"])
    with pytest.raises(ValueError, match="quotes"):
        quote_exec(["/opt/a'b/python3"])


def test_the_unit_runs_the_agent_forking_with_its_pid_file_and_restarts_it() -> None:
    text = unit_text(
        ["/usr/bin/python3", "-I", "/root/x/agent.pyz", "start"],
        "/root/x/data/agent.pid",
        {"PATH": "/usr/bin:/bin"},
        user=False,
    )
    lines = text.splitlines()
    assert 'ExecStart="/usr/bin/python3" "-I" "/root/x/agent.pyz" "start"' in lines
    assert "Type=forking" in lines and "PIDFile=/root/x/data/agent.pid" in lines
    assert "Restart=on-failure" in lines and "KillMode=process" in lines
    assert 'Environment="PATH=/usr/bin:/bin"' in lines
    assert lines[-1] == "WantedBy=multi-user.target"
    user = unit_text(["/usr/bin/python3"], "/h/agent.pid", {}, user=True)
    assert user.splitlines()[-1] == "WantedBy=default.target"
    assert not any(line.startswith("Environment=") for line in user.splitlines())


def test_a_root_login_gets_a_system_unit_and_another_user_a_user_unit() -> None:
    args = ["-I", "/root/.dstack-plan/hosts/n1/agent.pyz", "start"]
    system = AgentUnit.of(ROOT_FACTS, "n1", args, "/root/.dstack-plan/hosts/n1/data/agent.pid")
    assert system.path == "/etc/systemd/system/dstack-plan-agent-n1.service"
    assert not system.user
    assert 'Environment="PATH=/usr/bin:/bin" "HOME=/root"' in system.text.splitlines()
    facts = SystemdFacts(
        uid=1000, root="", python="/usr/bin/python3", path="/bin", home="/home/u", linger=True
    )
    user = AgentUnit.of(facts, "n1", args, "/home/u/data/agent.pid")
    assert user.path == "/home/u/.config/systemd/user/dstack-plan-agent-n1.service"
    assert user.user and user.lingering
    assert "systemctl --user enable --now" in user.start_script(
        detached="D", stop_detached="S", status="T"
    )
    assert "loginctl enable-linger" in user.start_script(
        detached="D", stop_detached="S", status="T"
    )
    assert "loginctl" not in system.start_script(detached="D", stop_detached="S", status="T")


def test_facts_without_systemd_say_none() -> None:
    assert SystemdFacts.parse({"dir": "/root/x"}) is None
    parsed = SystemdFacts.parse(
        {"systemd_uid": "0", "python": "/usr/bin/python3", "path": "/bin", "home": "/root"}
    )
    assert parsed is not None and not parsed.user and parsed.root == ""


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_reads_the_unit_with_awkward_paths_as_written(tmp_path: Path) -> None:
    weird = tmp_path / WEIRD
    weird.mkdir()
    (tmp_path / PROGRAM_DIR).mkdir()
    python = tmp_path / PROGRAM_DIR / "python3"
    python.symlink_to(shutil.which("python3") or "/usr/bin/python3")
    data = weird / "data"
    unit = AgentUnit.of(
        ROOT_FACTS.__class__(**{**ROOT_FACTS.__dict__, "python": str(python)}),
        "n1",
        ["-I", str(weird / "agent.pyz"), "start", "--data-dir", str(data)],
        str(data / "agent.pid"),
    )
    path = tmp_path / unit.name
    path.write_text(unit.text + "\n")
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True
    )
    # systemd found the program at the path written: the quoting of `$`, `%`, `"`, `\`, `'`
    # and spaces is as systemd reads it
    assert done.returncode == 0, done.stderr
    python.unlink()
    missing = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True
    )
    assert missing.returncode != 0 and f"Command {python} is not executable" in missing.stderr
