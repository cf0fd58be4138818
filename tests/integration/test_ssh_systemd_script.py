"""The systemd start script for a non-root login, run by a real `sh` against stub tools.

The SSH test hosts log in as root; a user unit (`systemctl --user`, lingering) and a service
manager that does not answer are exercised here, with a stub `systemctl` and `loginctl` first
on PATH that log their arguments (the agent commands are stubs that say what they would do).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from dstack_plan.providers.ssh.systemd import AgentUnit, SystemdFacts

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "$LOG"
case "$(basename "$0") $*" in
  "systemctl --user is-active"*) if [ -n "$NO_BUS" ]; then
      echo "Failed to connect to bus: No medium found" >&2; exit 1; fi
    echo inactive; exit 3 ;;
  loginctl*) exit "${LINGER_EXIT:-0}" ;;
esac
exit 0
"""


def run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("systemctl", "loginctl"):
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    facts = SystemdFacts(
        uid=1000, root="", python="/usr/bin/python3", path="/bin", home=str(home), linger=False
    )
    unit = AgentUnit.of(facts, "n1", ["-I", "/x/agent.pyz", "start"], "/x/data/agent.pid")
    script = unit.start_script(
        detached="echo detached-start", stop_detached="echo stop-detached", status="echo status"
    )
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    done = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(home),
            "LOG": str(log),
            **env,
        },
    )
    return done, log.read_text().splitlines() if log.exists() else []


def test_a_user_unit_is_written_enabled_and_lingering_asked_for(tmp_path: Path) -> None:
    done, calls = run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["persistent=1", "was_running=0", "status"]
    name = "dstack-plan-agent-n1.service"
    unit_file = tmp_path / "home/.config/systemd/user" / name
    assert unit_file.read_text().splitlines()[-1] == "WantedBy=default.target"
    assert calls == [
        f"systemctl --user is-active {name}",
        "systemctl --user daemon-reload",
        f"systemctl --user enable --now --quiet {name}",
        "loginctl enable-linger",
    ]


def test_without_lingering_the_user_unit_is_not_persistent(tmp_path: Path) -> None:
    done, _ = run(tmp_path, LINGER_EXIT="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "persistent=0"


def test_a_user_manager_that_does_not_answer_falls_back_to_a_detached_start(
    tmp_path: Path,
) -> None:
    done, calls = run(tmp_path, NO_BUS="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "systemd_error=Failed to connect to bus: No medium found",
        "detached-start",
    ]
    assert len(calls) == 1  # nothing written, enabled or stopped
    assert not (tmp_path / "home/.config").exists()
