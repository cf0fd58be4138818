"""SSH fleet hosts are told apart by (hostname, port); str-or-bool fields word the string's
problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.config.loader import load_project
from dstack_plan.errors import ConfigError
from dstack_plan.plan.diff import diff_specs
from dstack_plan.plan.limits import checked_dependencies
from tests.conftest import run_main

FLEET = "type: fleet\nname: vms\nssh_config:\n  user: ubuntu\n{port}  hosts:\n{hosts}"


def fleet(hosts: str, port: str = "") -> str:
    return FLEET.format(port=port, hosts=hosts)


def check(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "f.dstack.yml").write_text(text)
    try:
        checked_dependencies(load_project(tmp_path), tmp_path)
    except ConfigError as e:
        return [str(i) for i in e.issues]
    return []


@pytest.mark.parametrize(
    "hosts",
    [
        "    - {hostname: 10.0.0.1, port: 22}\n    - {hostname: 10.0.0.1, port: 2222}\n",
        "    - 10.0.0.1\n    - {hostname: 10.0.0.1, port: 2222}\n",
        "    - {hostname: 10.0.0.1, port: 2201}\n    - {hostname: 10.0.0.1, port: 2202}\n",
    ],
    ids=["22-and-2222", "default-and-2222", "2201-and-2202"],
)
def test_one_address_on_several_ports_is_several_hosts(tmp_path: Path, hosts: str) -> None:
    assert check(tmp_path, fleet(hosts)) == []


@pytest.mark.parametrize(
    ("hosts", "port", "error"),
    [
        (
            "    - 10.0.0.1\n    - 10.0.0.2\n    - 10.0.0.1\n",
            "",
            "f.dstack.yml:8:7: error: host 10.0.0.1 port 22 is listed twice "
            "(first as ssh_config.hosts[0])",
        ),
        (  # no port is ssh_config's port: the same host as an explicit 22
            "    - 10.0.0.1\n    - {hostname: 10.0.0.1, port: 22}\n",
            "",
            "f.dstack.yml:7:7: error: host 10.0.0.1 port 22 is listed twice "
            "(first as ssh_config.hosts[0])",
        ),
        (
            "    - {hostname: 10.0.0.1, port: 2222}\n    - 10.0.0.9\n    - 10.0.0.1\n",
            "  port: 2222\n",
            "f.dstack.yml:9:7: error: host 10.0.0.1 port 2222 is listed twice "
            "(first as ssh_config.hosts[0])",
        ),
    ],
    ids=["hostname-twice", "default-and-explicit-22", "fleet-port-2222-twice"],
)
def test_the_same_hostname_and_port_twice_is_refused_at_the_second(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    hosts: str,
    port: str,
    error: str,
) -> None:
    assert check(tmp_path, fleet(hosts, port)) == [error]
    code, out, err = run_main(monkeypatch, capsys, "validate", str(tmp_path))
    assert (code, err.splitlines()) == (1, [error])
    assert "Traceback" not in out + err


def _spec(tmp_path: Path, text: str) -> dict:
    (tmp_path / "f.dstack.yml").write_text(text)
    return load_project(tmp_path).resources["fleet.vms"].normalized


def test_adding_a_port_of_a_listed_address_updates_the_fleet_in_place(tmp_path: Path) -> None:
    before = _spec(tmp_path, fleet("    - 10.0.0.1\n"))
    after = _spec(tmp_path, fleet("    - 10.0.0.1\n    - {hostname: 10.0.0.1, port: 2222}\n"))
    diff = diff_specs("fleet", before, after)
    assert diff.changed == ("ssh_config.hosts",)
    assert diff.forces_replacement == ()


def test_changing_a_kept_hosts_settings_still_forces_replacement(tmp_path: Path) -> None:
    hosts = "    - {hostname: 10.0.0.1, port: 2222, blocks: 1}\n    - 10.0.0.1\n"
    before = _spec(tmp_path, fleet(hosts))
    after = _spec(tmp_path, fleet(hosts.replace("blocks: 1", "blocks: 2")))
    assert diff_specs("fleet", before, after).forces_replacement == ("ssh_config.hosts",)


SERVICE = "type: service\nname: svc\nport: 80\ncommands: [serve]\n"


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (
            "gateway: a/b/c",
            "5:10: error: gateway: invalid reference 'a/b/c': expected <name> or <project>/<name>",
        ),
        (
            "gateway: ''",
            "5:10: error: gateway: invalid reference '': expected <name> or <project>/<name>",
        ),
        ("https: autox", "5:8: error: https: expected true, false or 'auto', got 'autox'"),
    ],
)
def test_a_string_or_boolean_field_reports_the_strings_problem(
    tmp_path: Path, line: str, error: str
) -> None:
    issues = check(tmp_path, f"{SERVICE}{line}\n")
    assert issues == [f"f.dstack.yml:{error}"]
    assert "boolean" not in issues[0]
