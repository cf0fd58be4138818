"""moto's S3 server as a process of its own, for tests of a hung endpoint.

The session's `moto_server` fixture (tests/infra/moto_server.py) runs moto in a thread of
the test process, which cannot be frozen alone. This one runs `python -m moto.server` as a
child: `frozen()` stops it with SIGSTOP (it keeps accepting TCP connections in the kernel's
backlog, then never answers: a hung endpoint, not a refused one) and always resumes it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.infra.moto_server import CREDENTIALS, REGION, S3Bucket

_START_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MotoProcess:
    """moto's server in a child process on a free loopback port."""

    def __init__(self) -> None:
        os.environ.update(CREDENTIALS)
        port = _free_port()
        self.endpoint_url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **CREDENTIALS},
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                self.client().list_buckets()
                return
            except Exception:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)

    @property
    def pid(self) -> int:
        return self.process.pid

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1})
        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name=REGION, config=config
        )

    def bucket(self, name: str) -> S3Bucket:
        """A new, empty bucket (an S3Bucket whose `url()` points at this server)."""
        self.client().create_bucket(Bucket=name)
        return S3Bucket(self, name)  # type: ignore[arg-type]

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The server stopped (SIGSTOP) for the body: connections hang; SIGCONT after."""
        os.kill(self.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
