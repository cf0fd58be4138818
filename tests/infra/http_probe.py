"""Reach a server a test started on loopback, waiting for it to come up."""

from __future__ import annotations

import time
import urllib.request


def fetch(port: int, timeout: float = 10.0) -> str:
    """GET / on 127.0.0.1:port, retrying until the server answers or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                return response.read().decode().strip()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
