"""Pre-flight: can this host take the agent (and containers)? Each failure says what to do.

One remote shell script gathers the facts in a single round trip; the TCP-forwarding check
opens a direct-tcpip channel, because the agent is reached through one.
"""

from __future__ import annotations

import json
import shlex

import asyncssh
from pydantic import BaseModel, ConfigDict

from dstack_plan.errors import SSHError
from dstack_plan.providers.ssh import locate

MIN_PYTHON = (3, 9)
CLOSED_PORT = 1  # tcpmux: nothing listens there, so "refused" proves forwarding works


class PreflightReport(BaseModel):
    """What pre-flight found on one host; `failures` empty means the host is usable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host: str
    user: str
    python: str | None
    """python3's version, None when there is none."""
    free_disk_mb: int | None
    docker: str | None
    """`user`, `sudo` (usable through `sudo -n`), `missing`, `denied`; None when not needed."""
    nvidia_gpus: int
    nvidia_runtime: bool
    tcp_forwarding: bool
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def raise_for_failures(self) -> None:
        """Raise one SSHError naming the host and listing every failure."""
        if self.failures:
            raise SSHError(self.host, "pre-flight failed: " + "; ".join(self.failures))


def _script(agent_dir: str, need_containers: bool) -> str:
    directory = locate.base(agent_dir)  # quoted: a space or `;` in it stays in the path
    runtimes = shlex.quote("{{json .Runtimes}}")
    lines = [
        'echo "user=$(id -un)"',
        "if command -v python3 >/dev/null 2>&1; then python3 -c "
        + shlex.quote('import sys; print("python=%d.%d.%d" % sys.version_info[:3])')
        + " || echo python=broken; else echo python=missing; fi",
        # the agent dir may not exist yet: measure the nearest directory that does
        f'd={directory}; while [ ! -d "$d" ]; do d=$(dirname "$d"); done',
        'df -Pk "$d" | awk \'NR==2 {print "free_kb=" $4}\'',
        "if command -v nvidia-smi >/dev/null 2>&1; then"
        " echo \"gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')\"; else echo gpus=0; fi",
    ]
    if need_containers:
        lines += [
            "if ! command -v docker >/dev/null 2>&1; then echo docker=missing",
            f"elif out=$(docker info --format {runtimes} 2>&1); then"
            ' echo docker=user; echo "runtimes=$out"',
            f"elif out2=$(sudo -n docker info --format {runtimes} 2>/dev/null); then"
            ' echo docker=sudo; echo "runtimes=$out2"',
            'else echo docker=denied; echo "docker_error=$(echo "$out" | tail -n 1)"; fi',
        ]
    return "\n".join([*lines, "exit 0"])


def _facts(output: str) -> dict[str, str]:
    facts = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            facts[key] = value
    return facts


async def _tcp_forwarding(conn: asyncssh.SSHClientConnection) -> bool:
    try:
        _, writer = await conn.open_connection("127.0.0.1", CLOSED_PORT)
    except asyncssh.ChannelOpenError as e:
        # "administratively prohibited" is sshd refusing; "connect failed" is the closed port
        return e.code != asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED
    writer.close()
    return True


async def preflight(
    conn: asyncssh.SSHClientConnection,
    host: str,
    *,
    need_containers: bool,
    need_gpu_containers: bool = True,
    agent_dir: str = ".dstack-plan",
    min_free_mb: int = 200,
    timeout: float = 30.0,
) -> PreflightReport:
    """Check `host` over `conn`; `agent_dir` is relative to the login user's home unless
    absolute. Docker is checked with `need_containers`, and its NVIDIA runtime (on a host
    with NVIDIA GPUs) only with `need_gpu_containers` too: what the runs going there need.
    Never raises for a failed check: they are all in the report's `failures`."""
    try:
        done = await conn.run(_script(agent_dir, need_containers), timeout=timeout)
    except (asyncssh.Error, OSError, TimeoutError) as e:
        raise SSHError(host, f"pre-flight could not run a command: {e}") from e
    facts = _facts(str(done.stdout or ""))
    user = facts.get("user", "?")
    failures = []

    python = facts.get("python")
    version: str | None = None
    if python in (None, "missing"):
        failures.append(
            f"python3 is not on the PATH of user {user}: the agent needs python3 >= 3.9 "
            "(Debian/Ubuntu: apt-get install python3)"
        )
    elif python == "broken":
        failures.append(f"python3 does not run for user {user}: reinstall python3 >= 3.9")
    else:
        version = python
        if tuple(int(p) for p in python.split(".")[:2]) < MIN_PYTHON:
            failures.append(f"python3 is {python}; the agent needs python3 >= 3.9: upgrade it")

    free_kb = facts.get("free_kb", "")
    free_mb = int(free_kb) // 1024 if free_kb.isdigit() else None
    where = agent_dir if agent_dir.startswith("/") else f"~/{agent_dir}"
    if free_mb is not None and free_mb < min_free_mb:
        failures.append(
            f"only {free_mb} MB free for {where}; the agent needs at least {min_free_mb} MB: "
            "free some disk space"
        )

    gpus = int(facts["gpus"]) if facts.get("gpus", "").isdigit() else 0
    docker = facts.get("docker") if need_containers else None
    runtimes: dict[str, object] = {}
    try:
        parsed = json.loads(facts.get("runtimes") or "{}")
        runtimes = parsed if isinstance(parsed, dict) else {}
    except json.JSONDecodeError:
        pass
    nvidia_runtime = any("nvidia" in name for name in runtimes)
    if docker == "missing":
        failures.append(
            "Docker is not installed and this fleet's runs need containers: install Docker "
            "Engine (https://docs.docker.com/engine/install/), or use runs without `image:`"
        )
    elif docker == "denied":
        failures.append(
            f"Docker is installed but user {user} cannot use it "
            f"({facts.get('docker_error', '').strip()}): add the user to the docker group "
            f"(sudo usermod -aG docker {user}) or allow it passwordless sudo"
        )
    elif docker in ("user", "sudo") and gpus and not nvidia_runtime and need_gpu_containers:
        # dstack issue #1947: without the runtime, GPU containers start without GPUs, silently
        failures.append(
            f"the host has {gpus} NVIDIA GPU(s) but Docker has no NVIDIA runtime: install the "
            "NVIDIA Container Toolkit and run `sudo nvidia-ctk runtime configure "
            "--runtime=docker`, then restart Docker"
        )

    forwarding = await _tcp_forwarding(conn)
    if not forwarding:
        failures.append(
            "sshd does not allow TCP forwarding, through which the agent is reached: set "
            "`AllowTcpForwarding yes` in /etc/ssh/sshd_config and reload sshd"
        )
    return PreflightReport(
        host=host,
        user=user,
        python=version,
        free_disk_mb=free_mb,
        docker=docker,
        nvidia_gpus=gpus,
        nvidia_runtime=nvidia_runtime,
        tcp_forwarding=forwarding,
        failures=tuple(failures),
    )
