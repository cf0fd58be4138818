"""The project's service token: what clients send (`Authorization: Bearer ...`) to reach a
service with `auth: true` through the proxy `dstack watch` runs. Kept in `.dstack/` with
the project's other local secrets (0600), generated on first use; never in state."""

from __future__ import annotations

import secrets
from pathlib import Path

from dstack_plan.state.atomic import write_private_atomic

TOKEN_FILE = Path(".dstack") / "service-token"


def project_token(project_dir: str | Path) -> str:
    """The project's service token, made (and written to `TOKEN_FILE`) if it has none."""
    path = Path(project_dir) / TOKEN_FILE
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(path, (token + "\n").encode())
    return token
