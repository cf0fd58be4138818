"""`dstack attach` and `apply --attach`: a run's ports reachable on this machine's 127.0.0.1.

On an SSH host the job's port is forwarded through the host's SSH connection (the server in
the tests listens on the host's own 127.0.0.1 only, so nothing but sshd on the host reaches
it); on the local fleet it is printed where it listens, nothing forwarded. The CLI runs as a
subprocess, as a user runs it, and is detached with SIGINT (Ctrl-C).
"""

from __future__ import annotations

import json
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import CLI, Dstack
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_ssh_fleet import remote, write_fleet  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts, slot_port

URL_LINE = re.compile(r"^(Forwarding|Listening): (http://127\.0\.0\.1:(\d+)) -> (\S+) (\S+):(\d+)")


def web_service(port: int, extra: str = "") -> str:
    """A service without an image (a process on its host) serving `hello from <hostname>`
    on the host's 127.0.0.1 only."""
    serve = (
        'mkdir -p www && echo "hello from $(hostname)" > www/index.html && '
        f"exec python3 -u -m http.server {port} --bind 127.0.0.1 -d www"
    )
    return (
        f"type: service\nname: web\nport: {port}\nstop_duration: 1s\n"
        f"commands: {json.dumps([serve])}\n{extra}"
    )


class Attached:
    """A `dstack` command running in the background; its stdout read line by line."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [*CLI, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, pattern: re.Pattern[str] | str, timeout: float = 90) -> re.Match[str]:
        """The first line (from now on) matching `pattern`."""
        wanted = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                line = ""
            if line is None:
                raise AssertionError(f"exited ({self.proc.wait()}) before {pattern!r}: {self}")
            self.seen.append(line)
            found = wanted.search(line)
            if found:
                return found
            assert time.monotonic() < deadline, f"no {pattern!r} in time: {self}"

    def interrupt(self, timeout: float = 30) -> int:
        """Ctrl-C, then its exit code."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def __str__(self) -> str:
        done = self.proc.stderr is not None and self.proc.poll() is not None
        stderr = self.proc.stderr.read() if done and self.proc.stderr else ""
        return "stdout:\n" + "".join(self.seen) + "\nstderr:\n" + stderr


@pytest.fixture
def attached(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[list[Attached]]:
    """Start background `dstack` commands with `start(...)`; killed at the end if still up."""
    started: list[Attached] = []
    yield started
    for one in started:
        one.kill()


def start(started: list[Attached], tmp_path: Path, env: dict[str, str], *args: str) -> Attached:
    one = Attached(list(args), tmp_path / "project", env)
    started.append(one)
    return one


def wait_for_status(dstack: Dstack, address: str, wanted: set[str], timeout: float = 60) -> None:
    """Until `dstack ps` shows `address` in one of the `wanted` statuses."""
    deadline = time.monotonic() + timeout
    while True:
        listed = dstack("ps", "--json", "-a")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        row = next((r for r in json.loads(listed.stdout) if r["address"] == address), None)
        if row and row["status"] in wanted:
            return
        assert time.monotonic() < deadline, f"{address} never reached {wanted}: {row}"
        time.sleep(0.2)


def get(url: str, timeout: float = 20) -> str:
    """GET `url`, retrying while the server is not up yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode().strip()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except OSError:
        return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listener() -> socket.socket:
    """A socket that binds a port its forwards just left (in TIME_WAIT), as servers do."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return s


def is_free(port: int) -> bool:
    with listener() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.ssh
def test_ports_of_a_service_on_an_ssh_host_are_forwarded_to_localhost(
    dstack: Dstack,
    tmp_path: Path,
    cli_env: dict[str, str],
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    attached: list[Attached],
) -> None:
    project = tmp_path / "project"
    h1 = ssh_hosts["h1"].address
    port = slot_port(0)  # known beforehand, and no other test run's or worker's
    assert is_free(port), f"something else listens on {port} here"
    write_fleet(project, ssh_hosts, "h1")
    (project / "web.dstack.yml").write_text(web_service(port, "fleets: [onprem]\n"))

    # apply --attach: the port is forwarded (on the container port: free here) while it streams
    applying = start(attached, tmp_path, cli_env, "apply", "-y", "--attach")
    line = applying.wait_for(URL_LINE)
    kind, url, local, job, host, container = line.groups()
    assert (kind, host, int(container)) == ("Forwarding", h1, port)
    assert job.startswith("web-0-0-")
    assert int(local) == port
    assert get(url) == "hello from h1"
    applying.wait_for('"GET / HTTP/1.1" 200')  # and the job's log is streamed meanwhile
    assert applying.interrupt() == 0, str(applying)
    assert refused(url)  # the forward closed with the command
    wait_for_status(dstack, "service.web", {"running"})  # the job keeps running

    # attach with the container port taken here: any free port instead
    with listener() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        attaching = start(attached, tmp_path, cli_env, "attach", "web")
        kind, url, local, *_ = attaching.wait_for(URL_LINE).groups()
        assert kind == "Forwarding" and int(local) != port
        assert get(url) == "hello from h1"
        assert attaching.interrupt() == 0, str(attaching)

        # --port chooses the local port; a local port in use is a clear error
        busy = taken.getsockname()[1]
        clash = dstack("attach", "web", "--port", f"{busy}:{port}")
        assert clash.returncode == 1
        assert f"--port {busy}:{port}: cannot listen on 127.0.0.1:{busy}" in clash.stderr
        assert "Traceback" not in clash.stderr
    chosen = free_port()
    pinned = start(attached, tmp_path, cli_env, "attach", "web", "--port", f"{chosen}:{port}")
    kind, url, local, *_ = pinned.wait_for(URL_LINE).groups()
    assert int(local) == chosen and url == f"http://127.0.0.1:{chosen}"
    assert get(url) == "hello from h1"
    assert pinned.interrupt() == 0, str(pinned)

    unknown = dstack("attach", "web", "--port", f"{chosen}:80")
    assert unknown.returncode == 1
    assert f"no job of service.web listens on port 80 (its ports: {port})" in unknown.stderr
    wait_for_status(dstack, "service.web", {"running"})
    assert dstack("destroy", "-y").returncode == 0


def test_a_port_on_the_local_fleet_is_printed_where_it_listens(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str], attached: list[Attached]
) -> None:
    project = tmp_path / "project"
    port = slot_port(1)
    (project / "web.dstack.yml").write_text(web_service(port, RESOURCES))
    (project / "hello.dstack.yml").write_text(
        f"type: task\nname: hello\ncommands: ['echo hi']\n{RESOURCES}"
    )
    assert dstack("apply", "-y").returncode == 0
    wait_for_status(dstack, "service.web", {"running"})

    attaching = start(attached, tmp_path, cli_env, "attach", "web")
    kind, url, local, job, _, container = attaching.wait_for(URL_LINE).groups()
    assert (kind, int(local), int(container)) == ("Listening", port, port)
    assert "(on this machine, nothing forwarded)" in attaching.seen[-1]
    assert get(url).startswith("hello from ")
    assert attaching.interrupt() == 0, str(attaching)
    assert not refused(url)  # nothing was forwarded: the job itself still answers

    moved = dstack("attach", "web", "--port", f"{free_port()}:{port}")
    assert moved.returncode == 1 and "nothing is forwarded on the local fleet" in moved.stderr

    wait_for_status(dstack, "task.hello", {"done"})
    no_ports = dstack("attach", "hello")
    assert no_ports.returncode == 0, no_ports.stdout + no_ports.stderr
    assert no_ports.stdout == "task.hello has no ports to forward.\nhi\n"

    missing = dstack("attach", "nope")
    assert missing.returncode == 1
    assert "no run 'nope' in state" in missing.stderr and "Traceback" not in missing.stderr
    assert dstack("destroy", "-y").returncode == 0
