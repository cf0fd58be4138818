"""What an SSH host has of the agent, told by one shell command with no python run on it.

    said = parse_facts(output of run(script(agent_dir)))
    said["dir"], said.get("sha")                 # where it goes, the build it has
    running(bundle, data, said)                  # Running, or None: no agent of that bundle
    unit_file(said)                              # UnitFile, or None: no systemd

The build is the sha256 recorded beside the bundle at upload (`agent.pyz.sha256`; hashed with
python3 once, and recorded, for a bundle uploaded before that file existed). An agent runs when
its pid file names a live process whose command line is that bundle's `serve` on that data dir
(a stale pid file names a dead process, or another program), and its connection file is that
process's (which says when it started: `Running.started_at`; the command also prints the
host's time, `now`, so that how long it has run is told by the host's clock alone). Where
systemd runs, the command also tells the agent's unit file (its sha256, and whether it is
enabled), so that a running agent is reused without asking systemctl anything. `install.py`
decides what to do with it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dstack_plan.agent.datadir import DataDir
from dstack_plan.agent.protocol import CONNECTION_FILE, TOKEN_FILE
from dstack_plan.providers.ssh.systemd import DETECT, ROOT_ENV, UNIT_PREFIX

BUNDLE_NAME = "agent.pyz"
SHA256_NAME = f"{BUNDLE_NAME}.sha256"
"""Beside the bundle on the host: its sha256, written at upload."""
_SHA256 = "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"
_PID_FILE = DataDir(Path("/")).pid_file.name


@dataclass(frozen=True)
class Running:
    """The agent serving the host's data dir, as its files say."""

    pid: int
    port: int
    version: str
    token: str
    started_at: float | None = None
    """When it started, by the host's clock (its connection file's `started_at`)."""


@dataclass(frozen=True)
class UnitFile:
    """The agent's systemd unit file as the host has it."""

    path: str
    present: bool
    sha256: str | None
    """None: no such file (or no sha256sum to hash it)."""
    enabled: bool


def base(agent_dir: str) -> str:
    """`agent_dir` as a shell word: relative ones are under the login user's home."""
    return (
        shlex.quote(agent_dir)
        if agent_dir.startswith("/")
        else f'"$HOME"/{shlex.quote(agent_dir)}'
    )


_SHA_CHECK = (
    f'if [ -f "$d/{BUNDLE_NAME}" ]; then if [ -f "$d/{SHA256_NAME}" ]; then '
    f'echo "sha=$(cat "$d/{SHA256_NAME}")"; '
    f'elif s=$(python3 -c {shlex.quote(_SHA256)} "$d/{BUNDLE_NAME}") && [ -n "$s" ]; then '
    f'echo "sha=$s"; printf "%s\\n" "$s" >"$d/{SHA256_NAME}" 2>/dev/null; fi; fi'
)
_RUNNING_CHECK = (
    f'p=$(cat "$d/data/{_PID_FILE}" 2>/dev/null); case "$p" in ""|*[!0-9]*) ;; '
    '*) if [ -r "/proc/$p/cmdline" ]; then echo "pid=$p"; '
    'echo "cmdline=$(tr "\\000" " " <"/proc/$p/cmdline")"; '
    f'echo "connection=$(cat "$d/data/{CONNECTION_FILE}" 2>/dev/null)"; '
    f'echo "token=$(cat "$d/data/{TOKEN_FILE}" 2>/dev/null)"; fi ;; esac'
)
# The unit file's path as `AgentUnit` makes it, for a node name that needs no escaping in a
# unit name (any other: no `unit_file=` line, so the install asks systemctl as before);
# enabled is the symlink `systemctl enable` makes for the unit's WantedBy=.
_UNIT_CHECK = (
    f'r="${{{ROOT_ENV}:-}}"; if [ -d "$r/run/systemd/system" ]; then '
    'case "$n" in *[!A-Za-z0-9:_.-]*) ;; *) '
    'if [ "$(id -u)" = 0 ]; then u="$r/etc/systemd/system"; w=multi-user.target; '
    'else u="$HOME/.config/systemd/user"; w=default.target; fi; '
    f'f="$u/{UNIT_PREFIX}$n.service"; echo "unit_file=$f"; '
    'if [ -f "$f" ]; then echo unit_present=1; '
    'echo "unit_sha=$(sha256sum <"$f" 2>/dev/null | cut -c1-64)"; fi; '
    f'if [ -L "$u/$w.wants/{UNIT_PREFIX}$n.service" ]; then echo unit_enabled=1; fi ;; '
    "esac; fi"
)


CLAIMS_NAME = "claims.json"
"""In the agent's data dir: the host's owning fleet (`agent/claims.py`), one line of JSON."""
_CLAIMS_CHECK = f'echo "claims=$(cat "$d/data/{CLAIMS_NAME}" 2>/dev/null)"'


def script(agent_dir: str) -> str:
    """The command: `key=value` lines (`dir`, `now`, `sha`, `claims`, `pid`, `cmdline`,
    `connection`, `token`, `SystemdFacts`' keys, `unit_*`)."""
    return (
        f'n=$(uname -n); d={base(agent_dir)}/hosts/"$n"; echo "dir=$d"; echo "now=$(date +%s)"; '
        f"{_SHA_CHECK}; {_CLAIMS_CHECK}; {_RUNNING_CHECK}; {DETECT}; {_UNIT_CHECK}"
    )


# Other agents serving this node from another data dir (another login user's home, another
# DSTACK_PLAN_SSH_AGENT_DIR): one `grep` over every process's command line, then a look at
# each match. A process in another network namespace is another host (containers; the test
# hosts share one machine); one whose namespace cannot be read (another user's) is not. One
# that exited while it was looked at (its namespace gone, its command line empty: it is gone or
# a zombie nobody reaped yet) serves nothing: a teardown elsewhere must not fail this enrolment.
_OTHERS_CHECK = (
    "me=$(readlink /proc/self/ns/net 2>/dev/null); "
    'for c in $(grep -lsa -e "agent.pyz" /proc/[0-9]*/cmdline); do '
    'p=${c%/cmdline}; p=${p#/proc/}; a=$(tr "\\000" " " 2>/dev/null <"$c") || continue; '
    'case "$a" in *" serve "*"--data-dir "*"/hosts/$n/data"*) ;; *) continue ;; esac; '
    'case "$a" in *" --data-dir $d/data"*) continue ;; esac; '
    'ns=$(readlink "/proc/$p/ns/net" 2>/dev/null); '
    'if [ -n "$ns" ] && [ -n "$me" ] && [ "$ns" != "$me" ]; then continue; fi; '
    'if [ -z "$ns" ] && ! grep -qsa -e "agent.pyz" "$c"; then continue; fi; '
    'echo "other=$p $(stat -c %U "/proc/$p" 2>/dev/null || echo ?) $a"; done'
)


def owners_script(agent_dir: str) -> str:
    """The command `script` runs, and also `other=PID USER CMDLINE` for every other agent
    that serves this node from another data dir: what enrolling a host checks."""
    return f"{script(agent_dir)}; {_OTHERS_CHECK}"


def other_agents(output: str) -> list[tuple[int, str, str]]:
    """(pid, user, data dir) of each `other=` line of `owners_script`'s output."""
    found = []
    for line in output.splitlines():
        if not line.startswith("other="):
            continue
        pid, _, rest = line.removeprefix("other=").partition(" ")
        user, _, cmdline = rest.partition(" ")
        words = cmdline.split()
        data = words[words.index("--data-dir") + 1] if "--data-dir" in words[:-1] else "?"
        if pid.isdigit():
            found.append((int(pid), user, data))
    return found


def claims(said: Mapping[str, str]) -> list[dict[str, object]]:
    """The claims the host's data dir records, as the command printed them (none when the
    file is missing or unreadable: the agent heals it on the next claim)."""
    try:
        data = json.loads(said.get("claims") or "[]")
    except ValueError:
        return []
    return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []


def parse_facts(output: str) -> dict[str, str]:
    """The command's output as a dict."""
    return dict(line.partition("=")[::2] for line in output.splitlines())


def running(bundle: str, data: str, said: Mapping[str, str]) -> Running | None:
    """The agent serving `data` from `bundle`, if the host said one runs; None when anything
    is missing or does not match."""
    pid = said.get("pid", "")
    cmdline = f" {said.get('cmdline', '')} "
    if not pid.isdigit():
        return None
    if f" {bundle} serve " not in cmdline or f" --data-dir {data} " not in cmdline:
        return None  # the pid file is stale: that pid is another process now
    try:
        info = json.loads(said.get("connection") or "null")
        if not isinstance(info, dict) or info.get("pid") != int(pid):
            return None  # a connection file from before, or not written yet
        started = info.get("started_at")
        found = Running(
            int(pid),
            int(info["port"]),
            str(info["version"]),
            said["token"].strip(),
            float(started) if isinstance(started, (int, float)) else None,
        )
    except (ValueError, KeyError, TypeError):
        return None
    return found if found.token else None


def unit_file(said: Mapping[str, str]) -> UnitFile | None:
    """The agent's unit file as the host said, None when it said nothing of one."""
    if "unit_file" not in said:
        return None
    return UnitFile(
        said["unit_file"],
        said.get("unit_present") == "1",
        said.get("unit_sha") or None,
        said.get("unit_enabled") == "1",
    )
