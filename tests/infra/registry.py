"""A private Docker registry on loopback with basic auth, for tests of authenticated pulls.

It is Debian's `docker-registry` (the CNCF distribution server) with an htpasswd file made by
`htpasswd -B` (apache2-utils); `scripts/test-deps.sh` installs both. dockerd talks plain HTTP
to registries on 127.0.0.0/8, so no certificates are needed.
"""

from __future__ import annotations

import http.client
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

USERNAME = "puller"


@dataclass(frozen=True)
class PrivateRegistry:
    address: str
    """host:port, the prefix of the registry's image references."""
    username: str
    password: str = field(repr=False)

    @property
    def auth_config(self) -> dict[str, str]:
        return {"username": self.username, "password": self.password}

    def push(self, docker_client: Any, local_image: str, repository: str) -> str:
        """Push `local_image` as `<address>/<repository>:v1`, then drop the local tag so a
        job has to pull it. Returns the reference."""
        target = f"{self.address}/{repository}"
        docker_client.images.get(local_image).tag(target, "v1")
        events = docker_client.images.push(
            target, tag="v1", auth_config=self.auth_config, stream=True, decode=True
        )
        errors = [e["error"] for e in events if isinstance(e, dict) and e.get("error")]
        docker_client.images.remove(f"{target}:v1")
        if errors:
            raise RuntimeError(f"cannot push {target}:v1: {errors[0]}")
        return f"{target}:v1"


def missing_tools() -> list[str]:
    return [tool for tool in ("docker-registry", "htpasswd") if shutil.which(tool) is None]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/v2/")
        return connection.getresponse().status == 401  # up, and demanding credentials
    except OSError:
        return False
    finally:
        connection.close()


@contextmanager
def private_registry(workdir: Path) -> Iterator[PrivateRegistry]:
    """Run a registry that only serves `puller` with a random password; stop it afterwards."""
    workdir.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(16)
    entry = subprocess.run(
        ["htpasswd", "-Bbn", USERNAME, password], capture_output=True, text=True, check=True
    ).stdout
    (workdir / "htpasswd").write_text(entry)
    port = _free_port()
    config = workdir / "config.yml"
    config.write_text(
        f"version: 0.1\n"
        f"log: {{level: warn}}\n"
        f"storage: {{filesystem: {{rootdirectory: {workdir / 'data'}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n"
        f"auth: {{htpasswd: {{realm: tests, path: {workdir / 'htpasswd'}}}}}\n"
    )
    with (workdir / "registry.log").open("wb") as log:
        server = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 20
        while not _answers(port):
            if server.poll() is not None or time.monotonic() > deadline:
                output = (workdir / "registry.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"docker-registry did not start:\n{output}")
            time.sleep(0.1)
        yield PrivateRegistry(f"127.0.0.1:{port}", USERNAME, password)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
