"""The agent as a systemd unit: the unit's name, text and the shell that installs or removes it.

Pure functions (no I/O): `install.py` runs what they build on the host, in the round trips it
makes anyway. Where systemd runs (`/run/systemd/system` is a directory and `systemctl` is on
PATH), root gets a system unit in `/etc/systemd/system/`, any other user a user unit in
`~/.config/systemd/user/` (it survives a reboot only with lingering on: `loginctl
enable-linger`, which the install tries).

    facts = SystemdFacts.parse(said)              # None: no systemd on the host
    unit = AgentUnit.of(facts, node, args, pid_file)
    script = unit.start_script(detached=..., stop_detached=..., status=...)

The unit runs the same `agent start` command the detached start runs (same data dir, port and
token files), as `Type=forking` with the agent's pid file: `systemctl start` returns once the
agent answers, and `Restart=on-failure` brings it back when it dies.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ROOT_ENV = "DSTACK_PLAN_SYSTEMD_ROOT"
"""For tests only: a directory standing in for `/` where systemd's directories are looked up
(`$ROOT/run/systemd/system`, `$ROOT/etc/systemd/system`), so a test host with a fake
`systemctl` does not touch this machine's real ones."""
UNIT_PREFIX = "dstack-plan-agent-"
LINGER_DIR = "/var/lib/systemd/linger"
_UNIT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.-")
# what `systemctl is-active` prints for a unit when the manager answered
_ACTIVE = "active|reloading|activating"
_INACTIVE = "inactive|failed|deactivating|maintenance|unknown"

DETECT = (
    f'r="${{{ROOT_ENV}:-}}"; '
    'if [ -d "$r/run/systemd/system" ] && command -v systemctl >/dev/null 2>&1; then '
    'echo "systemd_uid=$(id -u)"; echo "systemd_root=$r"; echo "python=$(command -v python3)"; '
    'echo "path=$PATH"; echo "home=$HOME"; '
    f'if [ -e {LINGER_DIR}/"$(id -un)" ]; then echo linger=1; fi; fi'
)
"""Shell printing `key=value` lines (`SystemdFacts.parse`) when systemd runs, nothing
otherwise; part of the install's first command."""


@dataclass(frozen=True)
class SystemdFacts:
    """What the host said about its systemd (from `DETECT`)."""

    uid: int
    root: str
    """`$DSTACK_PLAN_SYSTEMD_ROOT` on the host ('' outside tests)."""
    python: str
    path: str
    home: str
    linger: bool

    @classmethod
    def parse(cls, facts: Mapping[str, str]) -> SystemdFacts | None:
        """None when the host has no running systemd (or said something unusable)."""
        uid = facts.get("systemd_uid", "")
        if not uid.isdigit():
            return None
        return cls(
            uid=int(uid),
            root=facts.get("systemd_root", ""),
            python=facts.get("python", ""),
            path=facts.get("path", ""),
            home=facts.get("home", ""),
            linger=facts.get("linger") == "1",
        )

    @property
    def user(self) -> bool:
        """A user unit (not root)."""
        return self.uid != 0


def unit_name(node: str) -> str:
    """`dstack-plan-agent-<node>.service`, other characters than systemd allows in a unit name
    escaped as `systemd-escape` does (`\\xNN`)."""
    escaped = "".join(
        c if c in _UNIT_CHARS else "".join(f"\\x{b:02x}" for b in c.encode()) for c in node
    )
    return f"{UNIT_PREFIX}{escaped}.service"


def _no_control(text: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"{text!r} has a control character; it cannot go into a systemd unit")
    return text


def quote_value(text: str) -> str:
    """`text` as one double-quoted word of a unit file setting (`Environment=`): backslash and
    quote escaped, `%` doubled (systemd expands `%x` specifiers)."""
    escaped = _no_control(text).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def quote_exec(argv: Sequence[str]) -> str:
    """`argv` as an `ExecStart=` command line: each word double-quoted as `quote_value` does,
    and `$` doubled in the arguments (systemd substitutes `$VAR` there, not in the program).
    The program must be an absolute path (a leading `-`, `@`, `+`, `!` or `:` would be taken
    as a prefix) without quotes or backslashes (systemd refuses to run such a program)."""
    if not argv or not argv[0].startswith("/"):
        raise ValueError(f"the unit's program must be an absolute path, not {argv[:1]!r}")
    if any(c in argv[0] for c in "\\\"'"):
        raise ValueError(f"systemd cannot run a program whose path has quotes: {argv[0]!r}")
    program, *args = argv
    return " ".join([quote_value(program), *(quote_value(a).replace("$", "$$") for a in args)])


def unit_text(
    argv: Sequence[str],
    pid_file: str,
    environment: Mapping[str, str],
    *,
    user: bool,
    description: str = "dstack-plan agent",
) -> str:
    """The unit file (without a trailing newline): `argv` started as `Type=forking`, tracked
    by `pid_file`, restarted on failure, enabled for boot (or the user's login manager)."""
    if not pid_file.startswith("/"):
        raise ValueError(f"the pid file must be an absolute path, not {pid_file!r}")
    env = " ".join(quote_value(f"{k}={v}") for k, v in environment.items())
    lines = [
        "[Unit]",
        f"Description={_no_control(description).replace('%', '%%')}",
        "After=network.target docker.service",
        "",
        "[Service]",
        "Type=forking",
        f"ExecStart={quote_exec(argv)}",
        # PIDFile= takes the rest of the line as the path (no quotes), specifiers expanded
        f"PIDFile={_no_control(pid_file).replace('%', '%%')}",
        *([f"Environment={env}"] if env else []),
        "Restart=on-failure",
        "RestartSec=2",
        # like the detached agent: stopping it leaves the processes of its jobs running
        "KillMode=process",
        "",
        "[Install]",
        f"WantedBy={'default.target' if user else 'multi-user.target'}",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class AgentUnit:
    """The agent's unit on one host: its name, file and text, and how to drive it."""

    name: str
    directory: str
    """Where the unit file goes, absolute."""
    text: str
    user: bool
    lingering: bool = False
    """The user has lingering on (a user unit starts at boot, not at their first login)."""

    @classmethod
    def of(cls, facts: SystemdFacts, node: str, args: Sequence[str], pid_file: str) -> AgentUnit:
        """The unit running `python3 ARGS` (the host's python3) as the login user."""
        if facts.user:
            directory = f"{facts.home}/.config/systemd/user"
        else:
            directory = f"{facts.root}/etc/systemd/system"
        # the login's PATH and HOME, so the agent finds the tools the detached one would
        # (nvidia-smi, docker) and a system unit has a HOME at all
        environment = {"PATH": facts.path, "HOME": facts.home}
        text = unit_text(
            [facts.python, *args],
            pid_file,
            {k: v for k, v in environment.items() if v},
            user=facts.user,
            description=f"dstack-plan agent ({node})",
        )
        return cls(unit_name(node), directory, text, facts.user, facts.linger)

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.name}"

    @property
    def _ctl(self) -> str:
        return "systemctl --user" if self.user else "systemctl"

    def persistent_check(self) -> str:
        """Shell printing `persistent=0|1` when the unit file is installed (a user unit comes
        back after a reboot only with lingering on), nothing otherwise."""
        persistent = int(not self.user or self.lingering)
        return f"[ -f {shlex.quote(self.path)} ] && echo persistent={persistent}; "

    def _prelude(self) -> str:
        setup = f"u={shlex.quote(self.name)}; f={shlex.quote(self.path)}; "
        if self.user:
            # an SSH login without a PAM session may lack it; the user manager's bus is there
            setup += 'export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}"; '
        return setup

    def start_script(self, *, detached: str, stop_detached: str, status: str) -> str:
        """Shell that writes the unit (when its text changed), enables and starts it, then
        runs `status` (the agent's JSON and token). Before that it prints `persistent=0|1`
        (the unit comes back after a reboot) and `was_running=0|1`. When the service manager
        does not answer (a user without a session bus), it prints `systemd_error=...` and
        runs `detached` instead. `stop_detached` stops an agent started detached before, which
        would hold the data dir the unit's agent needs."""
        ctl = self._ctl
        linger = ""
        if self.user:
            linger = (
                f'if [ -e {LINGER_DIR}/"$(id -un)" ] || loginctl enable-linger >/dev/null 2>&1;'
                " then p=1; else p=0; fi; "
            )
        return (
            self._prelude()
            + f"t={shlex.quote(self.text)}; "
            + f'a=$({ctl} is-active "$u" 2>&1); '
            + 'case "$a" in '
            + f"{_ACTIVE}) w=1 ;; "
            + f"{_INACTIVE}) w=0 ;; "
            + f'*) echo "systemd_error=$(echo "$a" | head -n 1)"; {detached}; exit $? ;; '
            + "esac; "
            # a changed unit (another agent dir, PATH) replaces the agent it runs
            + 'if [ "$(cat "$f" 2>/dev/null)" != "$t" ]; then '
            + f'if [ $w = 1 ]; then {ctl} stop "$u" || exit $?; w=0; fi; '
            + f'mkdir -p {shlex.quote(self.directory)} && printf "%s\\n" "$t" >"$f.tmp" && '
            + f'mv -f "$f.tmp" "$f" && {ctl} daemon-reload || exit $?; fi; '
            + f"if [ $w = 0 ]; then {stop_detached} >/dev/null || exit $?; fi; "
            + f'if ! {ctl} enable --now --quiet "$u"; then '
            + f'{ctl} status --no-pager --lines 20 "$u" >&2; exit 1; fi; '
            + (linger or "p=1; ")
            + 'echo "persistent=$p"; echo "was_running=$w"; '
            + status
        )

    def restart_stop_script(self, stop_detached: str) -> str:
        """Shell that stops the unit's agent for a moment (a new build replaces it), so that
        systemd does not restart it meanwhile, then runs `stop_detached` (an agent started
        detached before); the unit stays enabled."""
        return self._prelude() + f'{self._ctl} stop "$u" 2>/dev/null; ' + stop_detached

    def stop_script(self, stop_detached: str) -> str:
        """Shell that disables and stops the unit and removes its file (nothing when there is
        none), then runs `stop_detached`; prints `stopped` when an agent was stopped."""
        ctl = self._ctl
        return (
            self._prelude()
            + 'if [ -f "$f" ]; then '
            + f'if {ctl} is-active --quiet "$u" 2>/dev/null; then echo stopped; fi; '
            + f'{ctl} disable --now --quiet "$u" 2>/dev/null; rm -f "$f"; '
            + f"{ctl} daemon-reload 2>/dev/null; fi; "
            + stop_detached
        )
