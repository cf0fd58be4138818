"""The project's local tokens, kept in `.dstack/` with its other local secrets (0600),
generated on first use; never in state.

- `TOKEN_FILE`: what clients send (`Authorization: Bearer ...`) to reach a service with
  `auth: true` through the proxy `dstack watch` runs;
- `web.auth.UI_TOKEN_FILE`: what the HTTP API of `dstack ui` / `watch --ui` wants when it
  listens on an address other than loopback.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from dstack_plan.config.atomic import write_private_atomic

TOKEN_FILE = Path(".dstack") / "service-token"


def project_token(project_dir: str | Path, name: str | Path = TOKEN_FILE) -> str:
    """The project's token in `name` (default the service token), made if it has none."""
    return ensure_token(project_dir, name)[0]


def ensure_token(project_dir: str | Path, name: str | Path = TOKEN_FILE) -> tuple[str, bool]:
    """The token in `project_dir/name` and whether it was made (and written, 0600) just now."""
    path = Path(project_dir) / name
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token, False
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private_atomic(path, (token + "\n").encode())
    return token, True
