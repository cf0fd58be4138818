"""`type: gateway` with `backend: ssh`: what it needs, where its errors point, the edge to its
fleet, and the URLs it serves services at."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstack_plan.config.loader import load_project
from dstack_plan.errors import ConfigError
from dstack_plan.graph.references import dependencies

FLEET = "type: fleet\nname: onprem\nssh_config: {user: root, hosts: [10.0.0.1]}\n"
GATEWAY = (
    "type: gateway\nname: gw\nbackend: ssh\nfleet: onprem\ndomain: example.com\n"
    "certificate: {type: file, cert: gw.crt, key: gw.key}\n"
)


def errors(tmp_path: Path, text: str) -> str:
    (tmp_path / "gw.dstack.yml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_project(tmp_path)
    return str(info.value)


def test_a_gateway_on_an_ssh_host_depends_on_its_fleet(tmp_path: Path) -> None:
    (tmp_path / "fleet.dstack.yml").write_text(FLEET)
    (tmp_path / "gw.dstack.yml").write_text(GATEWAY)
    desired = load_project(tmp_path)
    assert dependencies(desired, tmp_path)["gateway.gw"] == ("fleet.onprem",)
    assert desired.resources["gateway.gw"].spec.provider == "ssh"  # type: ignore[attr-defined]


def test_a_gateway_on_an_undeclared_fleet_is_located_at_fleet(tmp_path: Path) -> None:
    (tmp_path / "gw.dstack.yml").write_text(GATEWAY)
    with pytest.raises(ConfigError) as info:
        dependencies(load_project(tmp_path), tmp_path)
    assert "gw.dstack.yml:4:1" in str(info.value)
    assert "gateway.gw refers to fleet.onprem, which is not declared" in str(info.value)


def test_lets_encrypt_is_refused_on_an_ssh_host_where_it_is_written(tmp_path: Path) -> None:
    text = GATEWAY.replace("{type: file, cert: gw.crt, key: gw.key}", "{type: lets-encrypt}")
    found = errors(tmp_path, text)
    assert "gw.dstack.yml:6:14" in found
    assert "cannot get a lets-encrypt certificate" in found
    # the default certificate is lets-encrypt: said too, at the document
    found = errors(tmp_path, text.replace("certificate: {type: lets-encrypt}\n", ""))
    assert "certificate: {type: file, cert: PATH, key: PATH}" in found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GATEWAY.replace("fleet: onprem\n", ""), "needs `fleet`"),
        (GATEWAY.replace("domain: example.com\n", ""), "needs a `domain`"),
        ("type: gateway\nname: gw\nbackend: aws\n", "missing required key 'region'"),
        ("type: gateway\nname: gw\nbackend: aws\nregion: x\nfleet: f\n", "fleet and host are"),
        (GATEWAY + "port: 70000\n", "port"),
    ],
)
def test_what_a_gateway_needs(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in errors(tmp_path, text)
