"""`dstack attach` on a dev environment: a `Host <run>` SSH entry that a real `ssh` uses.

The job's sshd (started by its host's agent) listens on the host's 127.0.0.1 only; the entry
jumps through the host's own SSH (the namespace host's sshd), pinning both host keys. The
CLI writes into `$DSTACK_PLAN_SSH_CONFIG_DIR` (never the real ~/.ssh), and the test runs the
system `ssh -F <that config>`.
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
from pathlib import Path

import pytest

from dstack_plan.agent.client import AgentClient
from tests.e2e.conftest import Dstack
from tests.e2e.test_attach_ports import Attached, attached, start  # noqa: F401 - fixture
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

SSH_LINE = re.compile(r"^SSH: ssh -F (\S+) (\S+)$")


@pytest.fixture
def ssh_dir(cli_env: dict[str, str]) -> Path:
    """Where the CLI writes its SSH config (instead of ~/.dstack-plan/ssh and ~/.ssh)."""
    return Path(cli_env["DSTACK_PLAN_SSH_CONFIG_DIR"])


def dev_environment(extra: str = "") -> str:
    return f"type: dev-environment\nname: dev\nide: vscode\nstop_duration: 1s\n{extra}"


def ssh(config: Path, host: str, *command: str) -> subprocess.CompletedProcess[str]:
    """The system ssh with the written config only (no agent, no prompts)."""
    return subprocess.run(
        [
            "ssh",
            "-F",
            str(config),
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            host,
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def attach_entry(attached: list[Attached], tmp_path: Path, env: dict[str, str]) -> Attached:  # noqa: F811
    """`dstack attach dev` in the background, once it has printed its ssh command."""
    attaching = start(attached, tmp_path, env, "attach", "dev")
    config, host = attaching.wait_for(SSH_LINE).groups()
    assert (Path(config), host) == (tmp_path / "ssh-config" / "config", "dev")
    return attaching


def entry_gone(ssh_dir: Path) -> bool:
    config = (ssh_dir / "config").read_text()
    return "Host dev" not in config and not (ssh_dir / "known_hosts" / "dev").exists()


@pytest.mark.ssh
@pytest.mark.docker
def test_ssh_into_a_dev_environments_container_through_its_host(
    dstack: Dstack,
    tmp_path: Path,
    cli_env: dict[str, str],
    ssh_hosts: SSHTestHosts,
    docker_client: object,
    remote: Path,  # noqa: F811
    attached: list[Attached],  # noqa: F811
    ssh_dir: Path,
) -> None:
    from tests.infra.docker_images import ensure_busybox_image

    image = ensure_busybox_image(docker_client)
    project = tmp_path / "project"
    h1 = ssh_hosts["h1"]
    write_fleet(project, ssh_hosts, "h1")
    (project / "dev.dstack.yml").write_text(dev_environment(f"image: {image}\nfleets: [onprem]\n"))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "dev-environment.dev", {"running"}, timeout=60)

    attaching = attach_entry(attached, tmp_path, cli_env)
    workdir = attaching.wait_for(r"^Open in VS Code: ").string.strip()
    assert workdir == "Open in VS Code: vscode://vscode-remote/ssh-remote+dev/"
    config = ssh_dir / "config"
    text = config.read_text()
    assert "Host dstack-plan-jump-dev\n" in text and "ProxyJump dstack-plan-jump-dev\n" in text
    assert f"HostName {h1.address}\n" in text and "HostName 127.0.0.1\n" in text
    assert "StrictHostKeyChecking yes" in text
    key = str(project / ".dstack" / "ssh" / "id_ed25519")
    assert f'IdentityFile "{key}"' in text
    # both keys pinned: the host's (as the fleet recorded it) and the job server's
    pins = (ssh_dir / "known_hosts" / "dev").read_text()
    assert f"{h1.address} ssh-ed25519 {h1.public_host_key()}\n" in pins
    assert re.search(r"^dstack-plan-dev ssh-ed25519 \S+$", pins, re.M)

    assert ssh(config, "dev", "true").returncode == 0
    # inside the container: the job's env, and busybox's /bin/sh (the host's is dash)
    inside = ssh(config, "dev", "echo $DSTACK_RUN_NAME; readlink /bin/sh; cat /etc/passwd")
    assert inside.returncode == 0, inside.stderr
    lines = inside.stdout.splitlines()
    assert lines[:2] == ["dev", "busybox"]
    assert lines[2].startswith("root:x:0:0:root:/root:/bin/sh")
    # a command's words reach the container as written (no second shell splitting them)
    quoted = ssh(config, "dev", "printf '%s|' 'a b' '$HOME' \";\"")
    assert quoted.stdout == "a b|$HOME|;|", quoted.stderr

    # the server listens on the host's loopback only: nothing reaches it from the network
    port = int(
        re.search(r"Port (\d+)\n    User \S+\n    IdentityFile \"" + re.escape(key), text)[1]
    )
    with pytest.raises(OSError):
        socket.create_connection((h1.address, port), timeout=3).close()

    assert attaching.interrupt() == 0, str(attaching)
    assert ssh(config, "dev", "true").returncode == 0  # detaching leaves the entry
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert entry_gone(ssh_dir)
    assert ssh(config, "dev", "true").returncode != 0


@pytest.mark.ssh
def test_ssh_into_a_dev_environment_process_behind_a_jump_host(
    dstack: Dstack,
    tmp_path: Path,
    cli_env: dict[str, str],
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    attached: list[Attached],  # noqa: F811
    ssh_dir: Path,
) -> None:
    project = tmp_path / "project"
    jump, inner = ssh_hosts["jump"], ssh_hosts["inner"]
    (project / "fleet.dstack.yml").write_text(
        "type: fleet\nname: onprem\nssh_config:\n  user: root\n"
        f"  identity_file: {ssh_hosts.client_key}\n"
        f"  proxy_jump: {{hostname: {jump.address}, user: root, "
        f"identity_file: {ssh_hosts.client_key}}}\n"
        f"  hosts:\n    - {inner.address}\n"
    )
    (project / "dev.dstack.yml").write_text(dev_environment("fleets: [onprem]\n"))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "dev-environment.dev", {"running"}, timeout=60)

    attaching = attach_entry(attached, tmp_path, cli_env)
    config = ssh_dir / "config"
    text = config.read_text()
    # the fleet's jump host, then the job's host through it, then the job through that
    assert "Host dstack-plan-jump-dev-1\n" in text and "ProxyJump dstack-plan-jump-dev-1\n" in text
    pins = (ssh_dir / "known_hosts" / "dev").read_text()
    assert f"{inner.address} ssh-ed25519 {inner.public_host_key()}\n" in pins

    # a process job: the session runs on its host, in the job's working dir
    found = ssh(config, "dev", "hostname; pwd; echo $DSTACK_RUN_NAME")
    assert found.returncode == 0, found.stderr
    host, workdir, run = found.stdout.splitlines()
    assert (host, run) == ("inner", "dev")
    assert workdir.endswith("/work") and "/jobs/dev-0-0-" in workdir
    assert attaching.interrupt() == 0, str(attaching)

    stopped = dstack("stop", "dev", "-y")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert entry_gone(ssh_dir)
    assert dstack("destroy", "-y").returncode == 0


def test_ssh_into_a_dev_environment_on_this_machine(
    dstack: Dstack,
    tmp_path: Path,
    cli_env: dict[str, str],
    attached: list[Attached],  # noqa: F811
    ssh_dir: Path,
) -> None:
    project = tmp_path / "project"
    (project / "dev.dstack.yml").write_text(
        dev_environment(RESOURCES).replace("ide: vscode", "ide: cursor")
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "dev-environment.dev", {"running"}, timeout=60)

    attaching = attach_entry(attached, tmp_path, cli_env)
    link = attaching.wait_for(r"^Open in Cursor: cursor://vscode-remote/ssh-remote\+dev(/\S+)$")
    config = ssh_dir / "config"
    assert "ProxyJump" not in config.read_text()  # nothing to jump through here
    found = ssh(config, "dev", "pwd")
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == link[1]
    assert attaching.interrupt() == 0, str(attaching)

    # its job gone from the agent (as when its host leaves the fleet): the apply that starts
    # it again removes the entry that reached the old job, which no delete did
    [job_id] = [
        j["id"] for j in state(project)["resources"]["dev-environment.dev"]["attributes"]["jobs"]
    ]

    async def lose_the_job() -> None:
        async with AgentClient.from_data_dir(tmp_path / "agent") as agent:
            await agent.delete(job_id, force=True)

    asyncio.run(lose_the_job())
    again = dstack("apply", "-y")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "drift" in again.stdout
    assert entry_gone(ssh_dir)

    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert entry_gone(ssh_dir)
