"""`dstack exec` against real sshd hosts in network namespaces (tests/infra/ssh_hosts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.infra.ssh_hosts import SUBNET, SSHTestHosts

pytestmark = pytest.mark.ssh

HOSTS = ("h1", "h2", "h3")


@pytest.fixture
def project(ssh_hosts: SSHTestHosts, tmp_path: Path, cli_env: dict[str, str]) -> Path:
    """A project with one SSH fleet `onprem` of h1..h3 and a local-only fleet `cpu`."""
    cli_env["HOME"] = str(tmp_path / "home")  # no ~/.ssh/known_hosts of root's in the way
    directory = tmp_path / "project"
    directory.mkdir(exist_ok=True)
    hosts = "\n".join(f"    - {ssh_hosts[n].address}" for n in HOSTS)
    (directory / "fleet.dstack.yml").write_text(
        "type: fleet\nname: onprem\nssh_config:\n  user: root\n"
        f"  identity_file: {ssh_hosts.client_key}\n  hosts:\n{hosts}\n"
        "---\ntype: fleet\nname: cpu\nnodes: 1\n"
    )
    return directory


def address(hosts: SSHTestHosts, name: str) -> str:
    return hosts[name].address


def test_exec_runs_on_every_host_with_prefixed_output(
    dstack: Dstack, project: Path, ssh_hosts: SSHTestHosts
) -> None:
    done = dstack("exec", "--", "hostname")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(lines[:-1]) == sorted(f"{address(ssh_hosts, n)} | {n}" for n in HOSTS)
    assert lines[-1] == "3 hosts: 3 ok, 0 failed"


def test_hosts_and_fleet_pick_a_subset(
    dstack: Dstack, project: Path, ssh_hosts: SSHTestHosts
) -> None:
    h2 = address(ssh_hosts, "h2")
    done = dstack("exec", "--fleet", "onprem", "--hosts", h2, "--", "hostname")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{h2} | h2", "1 host: 1 ok, 0 failed"]


def test_one_host_down_fails_alone_and_exit_code_is_1(
    dstack: Dstack, project: Path, ssh_hosts: SSHTestHosts
) -> None:
    h3 = address(ssh_hosts, "h3")
    ssh_hosts.stop("h3")
    try:
        done = dstack("exec", "--", "hostname")
        as_json = dstack("exec", "--json", "--", "hostname")
    finally:
        ssh_hosts.start("h3")
    assert done.returncode == 1
    reason = f"connection to {h3}:22 refused: is sshd running and listening on that port?"
    lines = done.stdout.splitlines()
    assert sorted(lines[:-1]) == sorted(f"{address(ssh_hosts, n)} | {n}" for n in ("h1", "h2"))
    assert lines[-1] == f"3 hosts: 2 ok, 1 failed ({h3}: {reason})"
    assert f"{h3} | error: {reason}" in done.stderr
    assert "Traceback" not in done.stderr

    assert as_json.returncode == 1
    results = {h["host"]: h for h in json.loads(as_json.stdout)["hosts"]}
    assert results[h3]["ok"] is False and results[h3]["exit_code"] is None
    assert results[h3]["error"] == reason
    assert results[address(ssh_hosts, "h1")]["stdout"] == "h1\n"


def test_json_gives_per_host_stdout_stderr_exit_code_and_duration(
    dstack: Dstack, project: Path, ssh_hosts: SSHTestHosts
) -> None:
    script = 'echo out-$(hostname); echo err >&2; [ "$(hostname)" != h2 ] || exit 3'
    done = dstack("exec", "--json", "--", "sh", "-c", script)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["command"] == ["sh", "-c", script]
    assert report["ok"] is False
    by_host = {h["host"]: h for h in report["hosts"]}
    assert list(by_host) == [address(ssh_hosts, n) for n in HOSTS]  # declaration order
    for name in HOSTS:
        host = by_host[address(ssh_hosts, name)]
        assert set(host) == {
            "host",
            "fleet",
            "ok",
            "exit_code",
            "stdout",
            "stderr",
            "duration_s",
            "error",
        }
        assert host["fleet"] == "onprem"
        assert host["stdout"] == f"out-{name}\n" and host["stderr"] == "err\n"
        assert 0 < host["duration_s"] < 30
    h2 = by_host[address(ssh_hosts, "h2")]
    assert (h2["ok"], h2["exit_code"], h2["error"]) == (False, 3, "exit code 3")
    h1 = by_host[address(ssh_hosts, "h1")]
    assert (h1["ok"], h1["exit_code"], h1["error"]) == (True, 0, None)
    assert (
        report["summary"] == f"3 hosts: 2 ok, 1 failed ({address(ssh_hosts, 'h2')}: exit code 3)"
    )


def test_arguments_with_spaces_and_metacharacters_arrive_intact(
    dstack: Dstack, project: Path, ssh_hosts: SSHTestHosts, tmp_path: Path
) -> None:
    h1 = address(ssh_hosts, "h1")
    marker = tmp_path / "pwned"
    args = ["a b", "$(x)", "`id`", "; touch " + str(marker), "'q'", '"dq"', "*", "--json"]
    done = dstack("exec", "--hosts", h1, "--", "printf", "%s\\n", *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:-1] == [f"{h1} | {a}" for a in args]
    assert not marker.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fleet", "nope"], "Error: fleet.nope is not declared (SSH fleets: onprem)\n"),
        (
            ["--fleet", "cpu"],
            "Error: fleet.cpu (fleet.dstack.yml (document 2)) is not an SSH fleet: exec runs "
            "on the hosts of fleets with ssh_config\n",
        ),
        ([], "Error: no command given: put it after `--` (dstack exec -- uname -a)\n"),
    ],
)
def test_bad_selection_is_a_clear_error(
    dstack: Dstack, project: Path, args: list[str], message: str
) -> None:
    done = dstack("exec", *args, *(["--", "true"] if args else []))
    assert (done.returncode, done.stdout, done.stderr) == (1, "", message)


def test_unknown_host_is_a_clear_error(
    dstack: Dstack, project: Path, ssh_hosts: SSHTestHosts
) -> None:
    done = dstack("exec", "--hosts", f"{SUBNET}.99", "--", "true")
    listed = ", ".join(address(ssh_hosts, n) for n in HOSTS)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: no host {SUBNET}.99 in the SSH fleets (hosts: {listed})\n"
