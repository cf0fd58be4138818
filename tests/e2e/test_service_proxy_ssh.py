"""Watch's proxy in front of a service on an SSH fleet (namespace hosts with their own
addresses): `python3 -m http.server` replicas, one on each host, each reached through an SSH
forward; a replica killed on its host leaves rotation (no request fails meanwhile), and
watch's retry policy starts it again."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_service_proxy import until, watching  # noqa: F401 - fixture
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh

SERVICE = (
    "type: service\nname: web\nfleets: [onprem]\nport: 8000\nreplicas: 2\nstop_duration: 1s\n"
    "auth: false\nretry: {on_events: [error], duration: 1h}\n"
    "probes: [{type: http, url: /, interval: 1s, timeout: 1s}]\n"
    "commands:\n  - mkdir -p www && echo served-by-$(hostname) > www/index.html\n"
    "  - exec python3 -m http.server 8000 --bind 127.0.0.1 --directory www\n"
)


def server_pids(marker: str) -> list[int]:
    """The pids of the replicas' http.server processes (the namespace hosts share our pids)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
            cwd = os.readlink(cmdline.parent / "cwd")
        except OSError:
            continue
        if b"http.server" in words and marker in cwd:
            found.append(int(cmdline.parent.name))
    return found


def test_replicas_on_ssh_hosts_are_served_and_a_killed_one_leaves_and_comes_back(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    watching: Any,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    write_fleet(project, ssh_hosts, "h2", "h3")
    (project / "web.dstack.yml").write_text(SERVICE)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "service.web", {"running"}, timeout=60)
    jobs = state(project)["resources"]["service.web"]["attributes"]["jobs"]
    assert sorted(j["host"] for j in jobs) == sorted(ssh_hosts[n].address for n in ("h2", "h3"))
    url = f"{watching()}/proxy/services/web/"

    def answers() -> set[str]:
        return {httpx.get(url, timeout=10).text.strip() for _ in range(8)}

    assert until(lambda: answers() == {"served-by-h2", "served-by-h3"})

    h3 = next(j for j in jobs if j["host"] == ssh_hosts["h3"].address)
    pids = server_pids(str(remote))
    killed = [p for p in pids if h3["id"] in os.readlink(f"/proc/{p}/cwd")]
    assert len(killed) == 1, (pids, h3["id"])
    os.kill(killed[0], signal.SIGKILL)
    # every request is answered meanwhile: the dead replica leaves rotation at its first
    # refused connection (or failed probe) and the request goes to the other one, until
    # watch's retry policy has started the replica again and the proxy routes to it
    seen: list[tuple[int, str]] = []

    def back() -> bool:
        responses = [httpx.get(url, timeout=10) for _ in range(8)]
        seen.extend((r.status_code, r.text.strip()) for r in responses)
        return {r.text.strip() for r in responses} == {"served-by-h2", "served-by-h3"}

    assert until(back, timeout=60)
    assert {status for status, _ in seen} == {200}, seen
    assert len(server_pids(str(remote))) == 2 and killed[0] not in server_pids(str(remote))
    assert dstack("destroy", "-y").returncode == 0
