"""The agent's data dir: where the token, pid, connection info and job records live."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from dstack_plan.agent.protocol import CONNECTION_FILE, TOKEN_FILE

AGENT_DIR_ENV = "DSTACK_PLAN_AGENT_DIR"


def default_agent_dir() -> Path:
    """Where this machine's agent keeps its data: `$DSTACK_PLAN_AGENT_DIR`, else
    `$XDG_STATE_HOME/dstack-plan/agent` (`~/.local/state/dstack-plan/agent`)."""
    configured = os.environ.get(AGENT_DIR_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "dstack-plan" / "agent"


def write_json_atomic(path: Path, data: Any, mode: int = 0o600, sync: bool = True) -> None:
    """Replace `path` with `data` so a reader (or, with `sync`, a crash) never sees a
    half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    """The JSON content of `path`."""
    with open(path) as f:
        return json.load(f)


class DataDir:
    """Paths inside one agent's data dir (created 0700 on first use)."""

    def __init__(self, root: Path):
        self.root = Path(root).absolute()

    def ensure(self) -> None:
        """Create the dir tree, the root 0700 (an existing dir keeps its mode: it may be shared,
        and the token and records are 0600 in any case)."""
        if not self.root.exists():
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self.root.mkdir(mode=0o700, exist_ok=True)
        self.jobs.mkdir(mode=0o700, exist_ok=True)

    @property
    def token_file(self) -> Path:
        return self.root / TOKEN_FILE

    @property
    def connection_file(self) -> Path:
        return self.root / CONNECTION_FILE

    @property
    def pid_file(self) -> Path:
        return self.root / "agent.pid"

    @property
    def serve_lock(self) -> Path:
        return self.root / "serve.lock"

    @property
    def start_lock(self) -> Path:
        return self.root / "start.lock"

    @property
    def log_file(self) -> Path:
        return self.root / "agent.log"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def blobs(self) -> Path:
        """Uploaded code archives, named by their sha256."""
        return self.root / "blobs"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs / job_id

    def token(self) -> str:
        """The bearer token, generated (mode 0600) the first time it is asked for."""
        try:
            return self.token_file.read_text().strip()
        except FileNotFoundError:
            pass
        token = secrets.token_urlsafe(32)
        try:
            fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            # Another process made it between our read and create: theirs wins.
            return self.token_file.read_text().strip()
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token

    def agent_id(self) -> str:
        """A random id for this data dir; container labels carry it so agents never mix."""
        path = self.root / "agent_id"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            agent_id = secrets.token_hex(8)
            path.write_text(agent_id + "\n")
            return agent_id
