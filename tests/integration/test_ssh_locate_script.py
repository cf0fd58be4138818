"""The one command that finds a host's agent, run by POSIX shells here (dash, busybox sh):
a live agent of the bundle is found; a stale pid file, another program, or a connection file of
another process is not taken for one.

The agent runs from a real bundle on this machine, under `<agent_dir>/hosts/<uname -n>/`, as
the install leaves it on a host.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstack_plan.providers.ssh.bundle import build_bundle
from dstack_plan.providers.ssh.locate import (
    SHA256_NAME,
    parse_facts,
    running,
    script,
    unit_file,
)
from tests.integration.test_agent_zipapp import system_python

SHELLS = [s for s in (["/bin/dash"], ["/usr/bin/busybox", "sh"]) if Path(s[0]).exists()]


@pytest.fixture(scope="module")
def host_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`hosts/<node>/` with the bundle, its recorded sha256 and a running agent."""
    agent_dir = tmp_path_factory.mktemp("remote")
    where = agent_dir / "hosts" / os.uname().nodename
    bundle = build_bundle(where / "agent.pyz")
    (where / SHA256_NAME).write_text(bundle.sha256 + "\n")
    data = where / "data"
    command = [system_python(), "-I", str(where / "agent.pyz")]
    subprocess.run([*command, "start", "--data-dir", str(data)], check=True, capture_output=True)
    yield where
    subprocess.run([*command, "stop", "--data-dir", str(data)], check=True, capture_output=True)


def ask(shell: list[str], agent_dir: Path, **env: str) -> dict[str, str]:
    done = subprocess.run(
        [*shell, "-c", script(str(agent_dir))],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"], "HOME": str(agent_dir), **env},
    )
    return parse_facts(done.stdout)


@pytest.mark.parametrize("shell", SHELLS, ids=[s[0] for s in SHELLS])
def test_a_running_agent_is_found_with_its_port_and_token(
    shell: list[str], host_dir: Path
) -> None:
    said = ask(shell, host_dir.parents[1])
    assert said["dir"] == str(host_dir)
    assert said["sha"] == hashlib.sha256((host_dir / "agent.pyz").read_bytes()).hexdigest()
    found = running(f"{host_dir}/agent.pyz", f"{host_dir}/data", said)
    assert found is not None
    assert found.pid == int((host_dir / "data/agent.pid").read_text())
    assert found.token == (host_dir / "data/token").read_text().strip()
    assert f":{found.port}" in (host_dir / "data/agent.json").read_text()
    assert unit_file(said) is None  # no systemd here


@pytest.mark.parametrize("shell", SHELLS, ids=[s[0] for s in SHELLS])
def test_no_agent_is_found_where_its_files_do_not_match(
    shell: list[str], host_dir: Path, tmp_path: Path
) -> None:
    said = ask(shell, host_dir.parents[1])
    bundle, data = f"{host_dir}/agent.pyz", f"{host_dir}/data"
    assert running(f"{tmp_path}/agent.pyz", data, said) is None  # another bundle's agent
    assert running(bundle, f"{tmp_path}/data", said) is None  # serving another data dir
    stale = {**said, "connection": said["connection"].replace(f'"pid":{said["pid"]}', '"pid":1')}
    assert running(bundle, data, stale) is None  # a connection file from another process
    assert running(bundle, data, {**said, "token": ""}) is None

    # a copy of the host whose pid file names a live process that is not the agent
    other = tmp_path / "remote" / "hosts" / os.uname().nodename
    shutil.copytree(host_dir, other, ignore=shutil.ignore_patterns("*.lock"))
    (other / "data/agent.pid").write_text(f"{os.getpid()}\n")
    said = ask(shell, tmp_path / "remote")
    assert running(f"{other}/agent.pyz", f"{other}/data", said) is None
    # and one naming no process at all
    (other / "data/agent.pid").write_text("999999999\n")
    said = ask(shell, tmp_path / "remote")
    assert "pid" not in said and running(f"{other}/agent.pyz", f"{other}/data", said) is None


def test_a_host_without_the_bundle_has_no_build(tmp_path: Path) -> None:
    said = ask(SHELLS[0], tmp_path)
    assert said["dir"] == f"{tmp_path}/hosts/{os.uname().nodename}"
    assert "sha" not in said and "pid" not in said
