"""`dstack watch --proxy-port`: a service's replicas served through the proxy watch runs,
on the local fleet with a real agent and real containers: requests reach both replicas,
`auth: true` wants the project's token, and a replica that stops is taken out of rotation."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_service_ports import httpd_service
from tests.infra.docker_images import ensure_busybox_image

pytestmark = pytest.mark.docker


@pytest.fixture
def watching(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Any]:
    watches = Watches(tmp_path / "project", cli_env)
    yield watches
    watches.stop()


class Watches:
    """`dstack watch` processes of one project: call to start one, `stop()` ends them all."""

    def __init__(self, project: Path, env: dict[str, str]) -> None:
        self.project, self.env = project, env
        self.started: list[subprocess.Popen[str]] = []

    def __call__(self, proxy_port: bool = True) -> str:
        """Start watch; the proxy's URL. Without `proxy_port`, watch serves by default
        (the UI and the services on one port, from 3000) once it leads."""
        serve = ["--proxy-port", "0"] if proxy_port else []
        proc = subprocess.Popen(
            [*CLI, "watch", "--interval", "0.5s", *serve],
            cwd=self.project,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(proc)
        assert proc.stdout is not None
        lines = ""
        for _ in range(4):  # `UI: ...` comes first when watch serves the UI too
            line = proc.stdout.readline()
            lines += line
            found = re.search(r"Services: (http://127\.0\.0\.1:\d+)/proxy/services/", line)
            if found:
                return found.group(1)
        raise AssertionError(lines + (proc.stderr.read() if proc.stderr else ""))

    def stop(self) -> None:
        """Ctrl-C every watch started, each of which must exit 0."""
        while self.started:
            proc = self.started.pop()
            proc.send_signal(signal.SIGINT)
            try:
                assert proc.wait(timeout=30) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()


def until(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_watch_serves_a_services_replicas_through_its_proxy(
    dstack: Dstack, tmp_path: Path, docker_client: Any, watching: Any
) -> None:
    image = ensure_busybox_image(docker_client)
    project = tmp_path / "project"
    (project / "web.dstack.yml").write_text(httpd_service(image, replicas=2))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "service.web", {"running"})
    base = watching()
    url = f"{base}/proxy/services/web/"
    token = (project / ".dstack" / "service-token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    # auth: true by default (once watch's first tick has given the proxy its routes)
    assert until(lambda: httpx.get(url, timeout=10).status_code == 401)

    def both() -> set[str]:
        seen = {httpx.get(url, headers=auth, timeout=10).text.strip() for _ in range(6)}
        return seen if seen == {"replica-0", "replica-1"} else set()

    assert until(both) == {"replica-0", "replica-1"}
    assert httpx.get(f"{base}/proxy/services/nope/", headers=auth, timeout=10).status_code == 404

    (project / "web.dstack.yml").write_text(httpd_service(image, replicas=1))
    scaled = dstack("apply", "-y")
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr

    def only_first() -> bool:
        seen = {httpx.get(url, headers=auth, timeout=10).text.strip() for _ in range(6)}
        return seen == {"replica-0"}

    assert until(only_first)
    # ps shows where it is served while watch runs, and says when no watch serves it
    assert until(lambda: json.loads(dstack("ps", "--json").stdout)[0]["url"] == url)
    watching.stop()
    (row,) = json.loads(dstack("ps", "--json").stdout)
    assert row["url"] is None
    assert any(n.startswith(f"not served: no dstack watch runs ({url})") for n in row["notes"])
    assert dstack("destroy", "-y").returncode == 0
