from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.infra.network_guard import guarded_getaddrinfo

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = REPO_ROOT.parent / "shared"


@pytest.fixture(autouse=True, scope="session")
def _block_stray_name_resolution():
    real = socket.getaddrinfo
    socket.getaddrinfo = guarded_getaddrinfo(real)
    yield
    socket.getaddrinfo = real


def require(variable: str, reason: str) -> None:
    """Skip with `reason`, or fail when CI set `variable` to demand the dependency."""
    if os.environ.get(variable) == "1":
        pytest.fail(f"{reason} (and {variable}=1 demands it)")
    pytest.skip(reason)
