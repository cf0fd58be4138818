"""`type: gateway` on a host of an SSH fleet (a network namespace with its own address): the
apply starts the relay there with a self-signed certificate, `dstack watch` holds the
reverse tunnel, and `https://web.example.test/` (resolved to the namespace address inside
the test only) reaches the service's replica on the fleet, its token required. The
gateway cannot leave while a service names it, and destroy stops its relay. The same on the
machine of a one-node cloud fleet (aws on moto server, the machine a namespace host)."""

from __future__ import annotations

import datetime
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.e2e.conftest import Dstack
from tests.e2e.test_cloud_fleet import FLEET, cloud, ec2  # noqa: F401 - fixtures
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_service_proxy import until, watching  # noqa: F401 - fixture
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh

DOMAIN = "example.test"


def self_signed(directory: Path) -> Path:
    """A certificate for `*.example.test` and its key, as gw.crt and gw.key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"*.{DOMAIN}")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"*.{DOMAIN}")]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    (directory / "gw.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "gw.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return directory / "gw.crt"


GATEWAY = (
    "type: gateway\nname: gw\nbackend: ssh\nfleet: onprem\ndomain: example.test\n"
    "certificate: {type: file, cert: gw.crt, key: gw.key}\n"
)
SERVICE = (
    "type: service\nname: web\nfleets: [onprem]\ngateway: gw\nport: 8000\nstop_duration: 1s\n"
    "commands:\n  - mkdir -p www && echo served-by-$(hostname) > www/index.html\n"
    "  - exec python3 -m http.server 8000 --bind 127.0.0.1 --directory www\n"
)


def https_get(address: str, cert: Path, token: str | None) -> httpx.Response:
    """GET https://web.example.test/ with the name resolved to `address` here only."""
    context = ssl.create_default_context(cafile=str(cert))
    headers = {"Host": f"web.{DOMAIN}"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with httpx.Client(verify=context, timeout=10) as client:
        return client.get(
            f"https://{address}/", headers=headers, extensions={"sni_hostname": f"web.{DOMAIN}"}
        )


def refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=3).close()
    except OSError:
        return True
    return False


def test_a_gateway_on_an_ssh_host_serves_a_service_over_tls_through_ssh_tunnels(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    watching: Any,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    write_fleet(project, ssh_hosts, "h1")
    cert = self_signed(project)
    (project / "gw.dstack.yml").write_text(GATEWAY)
    (project / "web.dstack.yml").write_text(SERVICE)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "service.web", {"running"}, timeout=60)
    address = ssh_hosts["h1"].address
    # no watch yet: the relay answers, and says why nothing is served
    no_watch = https_get(address, cert, None)
    assert no_watch.status_code == 503
    assert no_watch.text == "no dstack watch serves this gateway now: start dstack watch\n"
    assert dstack("plan", "--detailed-exitcode").returncode == 0  # the relay runs: no drift

    watching(proxy_port=False)  # no --proxy-port: the gateway asks for it
    token = (project / ".dstack" / "service-token").read_text().strip()
    served = until(lambda: (r := https_get(address, cert, token)).status_code == 200 and r)
    assert served.text.strip() == "served-by-h1"
    assert https_get(address, cert, None).status_code == 401  # auth: true by default
    assert https_get(address, cert, "wrong").status_code == 401
    assert until(
        lambda: any(
            r["url"] == "https://web.example.test/"
            for r in json.loads(dstack("ps", "--json").stdout)
        )
    )
    # the key went to the host, not into state
    assert "PRIVATE KEY" not in json.dumps(state(project))
    assert state(project)["resources"]["gateway.gw"]["attributes"]["address"] == address

    # a gateway a service names cannot go
    (project / "gw.dstack.yml").unlink()
    blocked = dstack("plan")
    assert blocked.returncode == 1
    assert "service.web refers to gateway.gw, which is not declared" in blocked.stderr
    (project / "gw.dstack.yml").write_text(GATEWAY)

    assert dstack("destroy", "-y").returncode == 0
    assert until(lambda: refused(address, 443))


def test_a_gateway_on_a_one_machine_cloud_fleet(
    dstack: Dstack,
    cloud: Path,  # noqa: F811
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    watching: Any,  # noqa: F811
) -> None:
    project = cloud  # aws on moto: its first machine is namespace host h2
    (project / "fleet.dstack.yml").write_text(FLEET.format(nodes=1).replace("burst", "edge"))
    cert = self_signed(project)
    (project / "gw.dstack.yml").write_text(GATEWAY.replace("onprem", "edge"))
    (project / "web.dstack.yml").write_text(SERVICE.replace("onprem", "edge"))
    applied = dstack("apply", "-y", timeout=300)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "service.web", {"running"}, timeout=60)
    address = ssh_hosts["h2"].address
    assert state(project)["resources"]["gateway.gw"]["attributes"]["address"] == address
    watching(proxy_port=False)  # no --proxy-port: the gateway asks for it
    token = (project / ".dstack" / "service-token").read_text().strip()
    served = until(lambda: (r := https_get(address, cert, token)).status_code == 200 and r)
    assert served.text.strip() == "served-by-h2"
    assert dstack("destroy", "-y", timeout=300).returncode == 0
    assert until(lambda: refused(address, 443))
