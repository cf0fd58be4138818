"""Commands must not guess, through the CLI as a user runs it, with a real agent: run arguments
after `--`, `apply --attach` following only what it started, the local agent started only when
needed (and said so), shell completion, and walking unreadable directories."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import wait_for_status

RESOURCES = "resources: {cpu: 1.., memory: 0.1GB.., disk: 1GB..}\n"
STARTED = "Started the local agent (pid "


def console_script() -> str:
    """The installed `dstack` script: completion keys on the program's name."""
    return str(Path(sys.executable).parent / "dstack")


def task(name: str, command: str) -> str:
    return f"type: task\nname: {name}\ncommands: [{command!r}]\n{RESOURCES}"


def test_run_arguments_come_after_a_double_dash(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    show = 'python3 -c "import sys; print(sys.argv[1:])" ${{ run.args }}'
    (project / "args.dstack.yml").write_text(task("show-args", show))
    stray = dstack("apply", "-y", "--attach", ".", "--lr")
    assert stray.returncode == 1
    assert "No such option: --lr" in stray.stderr
    assert not (project / ".dstack").exists()

    applied = dstack("apply", "-y", "--attach", ".", "--", "--lr", "0.1", "--name", "a b")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # each argument stays one: they are quoted for the shell the commands run in
    assert "['--lr', '0.1', '--name', 'a b']\n" in applied.stdout
    assert dstack("destroy", "-y").returncode == 0


def test_attach_follows_only_the_runs_this_apply_starts(dstack: Dstack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    service = f"type: service\nname: web\nport: 18947\ncommands: ['exec sleep 300']\n{RESOURCES}"
    (project / "web.dstack.yml").write_text(service)
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "service.web", {"running"})

    (project / "job.dstack.yml").write_text(task("once", "echo once done"))
    try:
        # before: attached to service.web as well, which never ends
        applied = dstack("apply", "-y", "--attach", timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("apply --attach waited on the unchanged service")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "Attached to task.once;" in applied.stderr
    assert "service.web" not in applied.stderr
    assert "once done" in applied.stdout

    # the configuration gone: plan refuses an empty directory, destroy still works from state
    for config in project.glob("*.dstack.yml"):
        config.unlink()
    planned = dstack("plan")
    assert planned.returncode == 1
    assert "no *.dstack.yml files found in ." in planned.stderr
    assert "holds 2 resource(s); `dstack destroy` removes them" in planned.stderr
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert "Destroy complete! Resources: 2 destroyed." in destroyed.stdout


def test_the_local_agent_starts_only_when_needed_and_says_so(
    dstack: Dstack, tmp_path: Path, agent_dir: Path
) -> None:
    project = tmp_path / "project"
    (project / "hello.dstack.yml").write_text(task("hello", "echo hi"))

    planned = dstack("plan")
    assert planned.returncode == 0, planned.stderr
    assert "Plan: 1 to add" in planned.stdout
    assert STARTED not in planned.stderr
    assert not agent_dir.exists()  # no agent, and no data dir made for one

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"data in {agent_dir}); it keeps running" in applied.stderr
    wait_for_status(dstack, "task.hello", {"done"})

    # the agent stopped (a reboot, say) while it holds a job record: plan must ask it
    stop = [*CLI[:1], "-m", "dstack_plan.agent", "stop", "--data-dir", str(agent_dir)]
    subprocess.run(stop, capture_output=True, timeout=60, check=True)
    replanned = dstack("plan", "--detailed-exitcode")
    assert replanned.returncode == 0, replanned.stdout + replanned.stderr
    assert "No changes." in replanned.stdout  # the job's record says done: no drift
    assert STARTED in replanned.stderr

    assert dstack("destroy", "-y").returncode == 0
    subprocess.run(stop, capture_output=True, timeout=60, check=True)
    after = dstack("plan")
    assert after.returncode == 0 and STARTED not in after.stderr


@pytest.mark.parametrize(
    ("shell", "env", "expected"),
    [
        ("bash", {"COMP_WORDS": "dstack pl", "COMP_CWORD": "1"}, "plan"),
        ("zsh", {"_TYPER_COMPLETE_ARGS": "dstack state s"}, '"show":'),
        (
            "fish",
            {
                "_TYPER_COMPLETE_ARGS": "dstack apply --paral",
                "_TYPER_COMPLETE_FISH_ACTION": "get-args",
            },
            "--parallelism",
        ),
    ],
)
def test_shell_completion_completes_commands_and_options(
    cli_env: dict[str, str], tmp_path: Path, shell: str, env: dict[str, str], expected: str
) -> None:
    # what the script from `dstack --install-completion` runs on each <TAB>
    script = console_script()
    done = subprocess.run(
        [script],
        env={**cli_env, "_DSTACK_COMPLETE": f"complete_{shell}", **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_show_completion_prints_the_script_for_the_shell(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    script = console_script()
    # the shell is told by the parent process: `; exit $?` keeps bash from exec'ing the script
    # (it would then see whatever started the tests, `sh` under make)
    done = subprocess.run(
        ["bash", "-c", f"{script} --show-completion; exit $?"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "_DSTACK_COMPLETE=complete_bash" in done.stdout


def _unprivileged() -> list[str]:
    """A prefix that runs a command without root's power to read anything."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a directory unreadable")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def test_validate_skips_an_unreadable_directory_with_a_warning(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / "locked").mkdir(parents=True)
    (project / "locked" / "hidden.dstack.yml").write_text(task("hidden", "echo"))
    (project / "ok.dstack.yml").write_text(task("visible", "echo"))
    (project / "locked").chmod(0)
    try:
        done = subprocess.run(
            [*_unprivileged(), *CLI, "validate", "."],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=project,
        )
    finally:
        (project / "locked").chmod(0o755)
    # before: an internal PermissionError on locked/pyvenv.cfg
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "skipped ./locked: cannot read it (Permission denied)\n"
    assert "1 resource" in done.stdout


def _root_like_tree(root: Path) -> None:
    """What `validate` meets from `/`, built in `root`: kernel file systems (a fresh procfs
    and this machine's /sys are mounted there by the test), a directory it cannot read, a
    symlink loop, a link up the tree, a FIFO, a socket, a device node, and one config."""
    (root / "proc").mkdir()
    (root / "sys").mkdir()
    (root / "srv" / "app").mkdir(parents=True)
    (root / "srv" / "app" / "ok.dstack.yml").write_text(task("visible", "echo"))
    (root / "locked").mkdir()
    (root / "locked" / "hidden.dstack.yml").write_text(task("hidden", "echo"))
    (root / "locked").chmod(0)
    (root / "loop").symlink_to("loop")
    (root / "srv" / "up").symlink_to("..")
    os.mkfifo(root / "fifo.dstack.yml")
    (root / "dev").mkdir()
    os.mknod(root / "dev" / "null.dstack.yml", 0o600 | 0o020000, os.makedev(1, 3))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "run.sock"))


def test_validate_from_a_root_like_tree_never_fails_internally(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """`dstack validate` started at a machine's root walks kernel file systems, unreadable
    directories and special files: it must skip them (never an internal error, never a
    message about /proc or /sys), and still validate the config it finds. The tree is
    built here, so what else is on the machine's disk changes nothing."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) to mount procfs in a private namespace")
    root = tmp_path / "root"
    root.mkdir()
    _root_like_tree(root)
    mount = 'mount -t proc proc proc && mount --rbind /sys sys && exec "$@"'
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"]
            + [*_unprivileged(), *CLI, "validate"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=root,
        )
    finally:
        (root / "locked").chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stderr.splitlines()) == [
        "skipped ./dev/null.dstack.yml: not a regular file",
        "skipped ./fifo.dstack.yml: not a regular file",
        "skipped ./locked: cannot read it (Permission denied)",
    ]
    assert "1 resource" in done.stdout
