"""A real agent process on a temp data dir, for tests and benchmarks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dstack_plan.agent.client import AgentClient

REPO_ROOT = Path(__file__).resolve().parents[2]


class AgentProcess:
    """A real agent (`python -m dstack_plan.agent serve`) on its own data dir."""

    def __init__(
        self,
        data_dir: Path,
        *,
        extra_path: Path | None = None,
        log_max_bytes: int | None = None,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
    ):
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{data_dir.name}.agent.log"
        self.command = command or [sys.executable, "-m", "dstack_plan.agent"]
        self.args = ["serve", "--data-dir", str(data_dir), "--port", "0", "--log-level", "debug"]
        if log_max_bytes is not None:
            self.args += ["--log-max-bytes", str(log_max_bytes)]
        self.env = dict(env if env is not None else os.environ)
        if env is None:
            self.env["PYTHONPATH"] = str(REPO_ROOT)
        if extra_path is not None:
            self.env["PATH"] = f"{extra_path}:{self.env.get('PATH', '/usr/bin:/bin')}"
        self.proc: subprocess.Popen | None = None
        self.on_client: Callable[[AgentClient], None] | None = None
        self.info: dict[str, Any] = {}

    def start(self, timeout: float = 15.0) -> AgentProcess:
        """Start the process and wait until it has written its connection info."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.command, *self.args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=self.env,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        connection = self.data_dir / "agent.json"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited ({self.proc.returncode}):\n{self.log()}")
            try:
                info = json.loads(connection.read_text())
                if info.get("pid") == self.proc.pid:
                    self.info = info
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        raise RuntimeError(f"agent did not start within {timeout}s:\n{self.log()}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the agent and wait for it to exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)

    def restart(self) -> AgentProcess:
        """SIGKILL, then start again on the same data dir."""
        self.kill()
        return self.start()

    @property
    def url(self) -> str:
        return self.info["url"]

    @property
    def token(self) -> str:
        return (self.data_dir / "token").read_text().strip()

    @property
    def agent_id(self) -> str:
        return (self.data_dir / "agent_id").read_text().strip()

    def client(self, **kwargs: Any) -> AgentClient:
        """A client for this agent (short timeouts, quick retries)."""
        kwargs.setdefault("timeout", 5.0)
        kwargs.setdefault("retry_delay", 0.05)
        client = AgentClient(self.url, self.token, **kwargs)
        if self.on_client is not None:
            self.on_client(client)
        return client

    def log(self) -> str:
        """What the agent wrote to stderr."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def remove_agent_containers(agent_ids: list[str]) -> None:
    """Remove every container an agent of this test created (found by label)."""
    try:
        import docker

        client = docker.from_env(timeout=20)
    except Exception:
        return
    try:
        for agent_id in agent_ids:
            for container in client.containers.list(
                all=True, filters={"label": f"dstack-plan.agent-id={agent_id}"}
            ):
                container.remove(force=True)
    except Exception:
        pass
    finally:
        client.close()


def kill_job_groups(data_dir: Path) -> None:
    """Process jobs live in their own groups; a SIGKILLed agent leaves them to us."""
    for record in data_dir.glob("jobs/*/job.json"):
        try:
            data = json.loads(record.read_text())
            pid = data.get("pid")
            if pid and data.get("status") in ("submitted", "running", "terminating"):
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
