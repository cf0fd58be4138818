"""A gateway shared across projects: project `platform` runs gateway `gw` on a namespace host
and exports it (and its fleet) to project `ml`, whose service names `gateway: platform/gw`.
Each project's own `dstack watch` serves its own services through the one gateway: ml's
watch opens its own tunnel to the gateway host (with ml's SSH key) and claims
`api.example.test`, while `web.example.test` stays platform's; each wants its own
project's token. A project the export does not name is refused at plan, as is a service
whose host name is one of the owner's. Revoking the export takes the gateway from ml's
service: the owner's watch drops ml's claim."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_fleet_exports import _projects_file
from tests.e2e.test_gateway import DOMAIN, GATEWAY, SERVICE, self_signed
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_service_proxy import Watches, until, watching  # noqa: F401 - fixture
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(600)]

ML_SERVICE = (
    "type: service\nname: {name}\nfleets: [platform/onprem]\ngateway: {gateway}\nport: 8001\n"
    "stop_duration: 1s\ncommands:\n  - mkdir -p www && echo ml-{name} > www/index.html\n"
    "  - exec python3 -m http.server 8001 --bind 127.0.0.1 --directory www\n"
)


def _ok(done: Any) -> None:
    assert done.returncode == 0, done.stdout + done.stderr


def _get(address: str, cert: Path, host: str, token: str) -> httpx.Response:
    """GET https://<host>/ with the name resolved to `address` here only."""
    context = ssl.create_default_context(cafile=str(cert))
    headers = {"Host": host, "Authorization": f"Bearer {token}"}
    with httpx.Client(verify=context, timeout=10) as client:
        sni = {"sni_hostname": host}
        return client.get(f"https://{address}/", headers=headers, extensions=sni)


def _token(project: Path) -> str:
    return (project / ".dstack" / "service-token").read_text().strip()


def test_an_exported_gateway_serves_each_project_s_services_through_its_own_watch(
    dstack: Dstack,
    tmp_path: Path,
    cli_env: dict[str, str],
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    watching: Any,  # noqa: F811
) -> None:
    platform, ml, other = tmp_path / "project", tmp_path / "ml", tmp_path / "other"
    for directory in (platform, ml, other):
        directory.mkdir(exist_ok=True)
    write_fleet(platform, ssh_hosts, "h1")
    cert = self_signed(platform)
    (platform / "gw.dstack.yml").write_text(GATEWAY)
    (platform / "web.dstack.yml").write_text(SERVICE)
    _ok(dstack("apply", "-y"))
    share = ["--fleet", "onprem", "--gateway", "gw", "--importer", f"ml={ml}/.dstack/state.json"]
    _ok(dstack("export", "create", "share", *share))

    # a project no export names is refused, naming the gateway, its owner and itself
    _projects_file(other, platform, ssh_hosts.client_key)
    (other / "api.dstack.yml").write_text(
        "type: service\nname: api\ngateway: {project: platform, name: gw}\nport: 8000\n"
        "commands: ['sleep 600']\n"
    )
    refused = dstack("plan", cwd=other)
    assert refused.returncode == 1
    assert "gateway 'gw' of project 'platform' is not exported to project 'other'" in (
        refused.stderr
    )
    assert "Traceback" not in refused.stderr

    # ml may not take a host name of the owner's services
    _projects_file(ml, platform, ssh_hosts.client_key)
    (ml / "web.dstack.yml").write_text(ML_SERVICE.format(name="web", gateway="platform/gw"))
    taken = dstack("plan", cwd=ml)
    assert taken.returncode == 1
    assert (
        f"host name web.{DOMAIN} on gateway platform/gw is project 'platform''s service 'web'"
        in taken.stderr
    )
    (ml / "web.dstack.yml").unlink()

    (ml / "api.dstack.yml").write_text(ML_SERVICE.format(name="api", gateway="platform/gw"))
    _ok(dstack("apply", "-y", cwd=ml))
    wait_for_status(dstack, "service.web", {"running"}, timeout=60)
    address = ssh_hosts["h1"].address

    # each project's watch serves its own services: no --proxy-port, the gateways ask for it
    watching(proxy_port=False)
    ml_watch = Watches(ml, cli_env)
    try:
        ml_watch(proxy_port=False)
        web, api = f"web.{DOMAIN}", f"api.{DOMAIN}"
        served = until(lambda: (r := _get(address, cert, web, _token(platform))).is_success and r)
        assert served.text.strip() == "served-by-h1"
        served = until(lambda: (r := _get(address, cert, api, _token(ml))).is_success and r)
        assert served.text.strip() == "ml-api"
        # each service wants its own project's token
        assert _get(address, cert, api, _token(platform)).status_code == 401
        rows = until(lambda: json.loads(dstack("ps", "--json", cwd=ml).stdout))
        assert until(
            lambda: (
                [r["url"] for r in json.loads(dstack("ps", "--json", cwd=ml).stdout)]
                == [f"https://{api}/"]
            )
        ), rows

        # revoked: the owner's watch drops ml's claim, and the name reaches the owner's proxy,
        # which serves no such host (421: misdirected)
        _ok(dstack("export", "delete", "share"))
        assert until(lambda: _get(address, cert, api, _token(ml)).status_code == 421)
        assert _get(address, cert, web, _token(platform)).text.strip() == "served-by-h1"
        again = dstack("plan", cwd=ml)
        assert again.returncode == 0, again.stderr  # no change to what runs: nothing refused
    finally:
        ml_watch.stop()
    _ok(dstack("destroy", "-y", cwd=ml))
    _ok(dstack("destroy", "-y"))
