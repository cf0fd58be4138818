"""`dstack watch` serves by default, as dstack's server does: while it leads, the UI, its API
and the services share one port on 127.0.0.1 (--bind's, the next free one when it is taken,
with a warning); a standby binds nothing until it leads, `--once` and `--no-serve` never
bind, and `ps` says how a service is reached or why it is not. A real local agent, a real
service (python's http.server)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_service_proxy import until

pytestmark = pytest.mark.timeout(300)

WEB = (
    "type: service\nname: web\nport: 18981\nauth: false\nstop_duration: 1s\n"
    "commands:\n  - mkdir -p www && echo served-by-watch > www/index.html\n"
    "  - exec python3 -m http.server 18981 --bind 127.0.0.1 --directory www\n"
    f"{RESOURCES}"
)


def _held_port() -> Iterator[socket.socket]:
    """A listening socket on a free loopback port (another server holding it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock
    finally:
        sock.close()


held_port = pytest.fixture(_held_port)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bound(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
    except OSError:
        return False
    return True


def _watch(project: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "watch", "--interval", "0.5s", *args],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return out, err


def _serving_url(proc: subprocess.Popen[str]) -> str:
    """The base URL the watch prints once it serves."""
    assert proc.stdout is not None
    seen = ""
    for _ in range(4):
        line = proc.stdout.readline()
        seen += line
        found = re.search(r"Services: (http://127\.0\.0\.1:\d+)/proxy/services/", line)
        if found:
            return found.group(1)
    raise AssertionError(seen)


def test_watch_serves_the_ui_and_the_services_on_one_port_while_it_leads(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str], held_port: socket.socket
) -> None:
    project = tmp_path / "project"
    (project / "web.dstack.yml").write_text(WEB)
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "service.web", {"running"})
    # before any watch: ps says why the service is not reached
    [row] = json.loads(dstack("ps", "--json").stdout)
    assert row["url"] is None
    assert row["notes"] == [
        "not served: no dstack watch runs; `dstack watch` serves it on 127.0.0.1:3000"
    ]

    taken = int(held_port.getsockname()[1])  # another project's watch or `dstack ui`
    leader = _watch(project, cli_env, "--bind", f"127.0.0.1:{taken}")
    standby = None
    try:
        base = _serving_url(leader)
        port = int(base.rsplit(":", 1)[1])
        assert port > taken  # the next free port, not an exit
        page = until(lambda: (r := httpx.get(f"{base}/proxy/services/web/")).is_success and r)
        assert page.text.strip() == "served-by-watch"
        # any method reaches the replica (http.server has no POST: 501), not the UI's 405
        assert httpx.post(f"{base}/proxy/services/web/", content=b"x").status_code == 501
        api = httpx.get(f"{base}/api/runs")  # the UI's API on the same port
        assert api.status_code == 200
        assert [r["address"] for r in api.json()] == ["service.web"]
        assert until(
            lambda: (
                json.loads(dstack("ps", "--json").stdout)[0]["url"]
                == f"{base}/proxy/services/web/"
            )
        )

        # a standby of the same project binds nothing: it ticks (its metrics file is
        # written after every tick) without serving
        spare = _free_port()
        metrics = tmp_path / "standby.prom"
        standby = _watch(
            project, cli_env, "--bind", f"127.0.0.1:{spare}", "--metrics-file", str(metrics)
        )
        until(lambda: metrics.exists() and "dstack_watch_leader 0" in metrics.read_text())
        assert not _bound(spare)
        out, _ = _stop(standby)
        standby = None
        assert "Services:" not in out
    finally:
        if standby is not None:
            standby.kill()
            standby.wait()
        _, err = _stop(leader)
    assert f"Warning: port {taken} is in use" in err
    assert until(lambda: not _bound(port))  # the server went with the watch


def test_once_and_no_serve_never_bind(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    (project / "web.dstack.yml").write_text(WEB)
    assert dstack("apply", "-y").returncode == 0
    port = _free_port()
    once = dstack("watch", "--once", "--bind", f"127.0.0.1:{port}")
    assert once.returncode == 0, once.stderr
    assert "Services:" not in once.stdout and "UI:" not in once.stdout
    metrics = tmp_path / "quiet.prom"
    quiet = _watch(
        project,
        cli_env,
        "--no-serve",
        "--bind",
        f"127.0.0.1:{port}",
        "--metrics-file",
        str(metrics),
    )
    try:
        until(lambda: metrics.exists() and "dstack_watch_leader 1" in metrics.read_text())
        assert not _bound(port)
    finally:
        out, _ = _stop(quiet)
    assert "Services:" not in out
    assert dstack("destroy", "-y").returncode == 0
