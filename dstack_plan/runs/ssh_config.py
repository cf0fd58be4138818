"""The SSH config `dstack attach` writes for dev environments: `Host <run>` entries in
`~/.dstack-plan/ssh/config`, included from `~/.ssh/config`, so `ssh <run>`, VS Code's
Remote-SSH and Cursor connect.

    entry = Entry(run="dev", job="dev-0-0-...", deployment="1a2b3c4d", hosts=[jump, job],
                  known_hosts=["dstack-plan-dev ssh-ed25519 AAAA..."])
    path = write_entry(entry)                  # replaces the run's entry, adds the Include
    remove_entries(run="dev", jobs={"dev-0-0-..."})

The directory is `$DSTACK_PLAN_SSH_CONFIG_DIR` when set, else `~/.dstack-plan/ssh`:

    config              one section per run, between `# dstack-plan: begin/end` markers
    known_hosts/<run>   the host keys pinned for the run's job and the hosts on the way
    keys/<run>-<n>      a jump host's inline `ssh_key.private`, when its fleet gives one (0600)

`~/.ssh/config` gets `Include <dir>/config` at its top, once; not when the directory is set
by the variable (tests; whoever moves it includes it themselves, or runs `ssh -F`). Every value
is checked before it goes into the file (an odd host name cannot smuggle in an option) and
paths are quoted, `%` escaped, as ssh_config reads them.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dstack_plan.errors import DstackPlanError

CONFIG_DIR_ENV = "DSTACK_PLAN_SSH_CONFIG_DIR"
BEGIN = "# dstack-plan: begin "
END = "# dstack-plan: end "
INCLUDE_NOTE = "# dstack-plan: dev environments attached with `dstack attach`"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_HOST = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_KEY = re.compile(r"[A-Za-z0-9@.-]+ [A-Za-z0-9+/]+={0,3}")
_META = re.compile(r"(\S+)=(\S*)")


def config_dir() -> Path:
    """`$DSTACK_PLAN_SSH_CONFIG_DIR`, else `~/.dstack-plan/ssh`."""
    configured = os.environ.get(CONFIG_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".dstack-plan" / "ssh"


def user_config() -> Path | None:
    """The SSH config that includes ours: `~/.ssh/config`; None when the directory is set by
    `$DSTACK_PLAN_SSH_CONFIG_DIR` (nothing outside it is touched then)."""
    if os.environ.get(CONFIG_DIR_ENV):
        return None
    return Path.home() / ".ssh" / "config"


@dataclass(frozen=True)
class HostBlock:
    """One `Host` block: the job's server, or a host on the way to it."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_file: Path | None = None
    proxy_jump: str | None = None
    """The alias of the block to jump through (None: connect directly)."""
    host_key_alias: str | None = None
    """The name its key is pinned under (the job's server: every one is 127.0.0.1)."""
    pinned: bool = True
    """Its key is in the run's known_hosts file; False: `~/.ssh/known_hosts` vouches for it
    (the fleet's connections trusted it from there, so pinned nothing)."""
    keepalive: bool = False


@dataclass(frozen=True)
class Entry:
    """A run's section: its blocks (jump hosts first, the run's own `Host <run>` last) and
    the known_hosts lines that pin their keys."""

    run: str
    job: str
    """The job it reaches (removal matches it: a newer job of another project's run of the
    same name keeps its entry)."""
    deployment: str
    hosts: tuple[HostBlock, ...]
    known_hosts: tuple[str, ...] = ()
    keys: dict[str, str] = field(default_factory=dict, repr=False)
    """Key file name -> an inline private key to write for a jump host (never printed)."""


@dataclass(frozen=True)
class Section:
    """A run's section as the config file holds it."""

    run: str
    meta: dict[str, str]
    text: str

    @property
    def job(self) -> str:
        return self.meta.get("job", "")

    @property
    def deployment(self) -> str:
        return self.meta.get("deployment", "")


def known_host(name: str, port: int, key: str) -> str:
    """A known_hosts line pinning `key` (`<algorithm> <base64>`) for `name` on `port`."""
    _check(_HOST, name, "host name")
    _check(_KEY, key, "host key")
    where = name if port == 22 else f"[{name}]:{port}"
    return f"{where} {key}"


def _check(pattern: re.Pattern[str], value: str, what: str) -> str:
    if not pattern.fullmatch(value):
        raise DstackPlanError(f"cannot write {what} {value!r} into an SSH config")
    return value


def _path_word(path: Path) -> str:
    """`path` as one quoted ssh_config word, `%` escaped (ssh expands `%` tokens there)."""
    text = str(path)
    if any(c in text for c in '"\n\r'):
        raise DstackPlanError(f"cannot write the path {text!r} into an SSH config")
    return '"' + text.replace("%", "%%") + '"'


def render_block(block: HostBlock, known_hosts: Path) -> str:
    """The `Host` block's text (lines indented by four spaces)."""
    lines = [
        f"Host {_check(_NAME, block.alias, 'host alias')}",
        f"HostName {_check(_HOST, block.hostname, 'host name')}",
        f"Port {int(block.port)}",
        f"User {_check(_USER, block.user, 'user')}",
    ]
    if block.identity_file is not None:
        lines += [f"IdentityFile {_path_word(block.identity_file)}", "IdentitiesOnly yes"]
    if block.proxy_jump is not None:
        lines.append(f"ProxyJump {_check(_NAME, block.proxy_jump, 'jump host alias')}")
    if block.host_key_alias is not None:
        lines.append(f"HostKeyAlias {_check(_NAME, block.host_key_alias, 'host key alias')}")
    files = _path_word(known_hosts) + ("" if block.pinned else " ~/.ssh/known_hosts")
    lines += [f"UserKnownHostsFile {files}", "StrictHostKeyChecking yes", "CheckHostIP no"]
    if block.keepalive:
        lines += ["ServerAliveInterval 30", "ServerAliveCountMax 4"]
    return "\n".join([lines[0], *(f"    {line}" for line in lines[1:])]) + "\n"


def render_entry(entry: Entry, directory: Path) -> str:
    """The run's section: the markers around its blocks."""
    _check(_NAME, entry.run, "run name")
    _check(_NAME, entry.job, "job id")
    _check(_NAME, entry.deployment, "deployment key")
    known = known_hosts_file(directory, entry.run)
    blocks = "\n".join(render_block(b, known) for b in entry.hosts)
    begin = f"{BEGIN}{entry.run} job={entry.job} deployment={entry.deployment}"
    return f"{begin}\n{blocks}{END}{entry.run}\n"


def known_hosts_file(directory: Path, run: str) -> Path:
    return directory / "known_hosts" / run


def parse_sections(text: str) -> tuple[list[Section], str]:
    """The sections of a config file, and whatever else it holds (kept as it is)."""
    sections: list[Section] = []
    other: list[str] = []
    current: list[str] | None = None
    head: tuple[str, dict[str, str]] | None = None
    for line in text.splitlines(keepends=True):
        if line.startswith(BEGIN):
            words = line[len(BEGIN) :].split()
            if words:
                meta = {m.group(1): m.group(2) for w in words[1:] if (m := _META.match(w))}
                head = (words[0], meta)
                current = [line]
                continue
        if current is not None and head is not None:
            current.append(line)
            if line.strip() == f"{END}{head[0]}":
                sections.append(Section(head[0], head[1], "".join(current)))
                current, head = None, None
            continue
        other.append(line)
    if current is not None:  # an unterminated section (hand-edited): kept as text
        other += current
    return sections, "".join(other)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold the directory's lock: two commands never interleave their rewrites."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    from dstack_plan.config.atomic import write_atomic

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, text.encode(), mode=mode)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _drop_files(directory: Path, run: str) -> None:
    known_hosts_file(directory, run).unlink(missing_ok=True)
    for key in (directory / "keys").glob(f"{run}-*"):
        key.unlink(missing_ok=True)


def write_entry(
    entry: Entry,
    directory: Path | None = None,
    *,
    include_into: Path | None = None,
    stale: Callable[[Section], bool] | None = None,
) -> Path:
    """Put `entry` into the config (replacing the run's section), its pinned keys and key
    files beside it; drop the sections `stale` says are (runs gone meanwhile); include the
    config from `include_into` when given (`user_config()`: the user's). Returns the config
    file."""
    directory = config_dir() if directory is None else directory
    config = directory / "config"
    section = render_entry(entry, directory)
    with _locked(directory):
        sections, other = parse_sections(_read(config))
        kept = []
        for old in sections:
            if old.run == entry.run:
                continue
            if stale is not None and stale(old):
                _drop_files(directory, old.run)
                continue
            kept.append(old.text)
        _drop_files(directory, entry.run)
        for name, key in entry.keys.items():
            _check(_NAME, name, "key file name")
            _write_atomic(directory / "keys" / name, key if key.endswith("\n") else key + "\n")
        known = "".join(line + "\n" for line in entry.known_hosts)
        _write_atomic(known_hosts_file(directory, entry.run), known)
        _write_atomic(config, _join(other, [*kept, section]))
    if include_into is not None:
        ensure_include(include_into, config)
    return config


def remove_entries(
    directory: Path | None = None,
    *,
    run: str | None = None,
    jobs: Collection[str] | None = None,
    deployment: str | None = None,
    keep_jobs: Collection[str] = (),
) -> list[str]:
    """Drop the sections that match every filter given (`run` name, one of `jobs`, the
    `deployment`), but never one of `keep_jobs`, with their files; the runs removed."""
    directory = config_dir() if directory is None else directory
    config = directory / "config"
    if not config.exists():
        return []
    with _locked(directory):
        sections, other = parse_sections(_read(config))
        removed = [
            s
            for s in sections
            if (run is None or s.run == run)
            and (jobs is None or s.job in jobs)
            and (deployment is None or s.deployment == deployment)
            and s.job not in keep_jobs
        ]
        if not removed:
            return []
        for section in removed:
            _drop_files(directory, section.run)
        kept = [s.text for s in sections if s not in removed]
        _write_atomic(config, _join(other, kept))
    return [s.run for s in removed]


def _join(other: str, sections: list[str]) -> str:
    head = other.strip("\n")
    parts = ([head + "\n"] if head else []) + sections
    return "\n".join(parts)


def include_line(config: Path) -> str:
    text = str(config)
    if any(c in text for c in '"\n\r'):
        raise DstackPlanError(f"cannot include {text!r} from an SSH config")
    return f'Include "{text}"' if " " in text else f"Include {text}"


def ensure_include(user_config: Path, config: Path) -> bool:
    """Put `Include <config>` at the top of `user_config` (created 0600 in a 0700 dir when
    missing) unless it is there already; True when it was added. At the top, so its hosts
    are not read as part of the last `Host` block of the file."""
    line = include_line(config)
    user_config = user_config.resolve()  # a symlinked one (dotfiles) stays a symlink
    text = _read(user_config)
    if any(existing.strip() == line for existing in text.splitlines()):
        return False
    mode = user_config.stat().st_mode & 0o777 if user_config.exists() else 0o600
    body = f"{INCLUDE_NOTE}\n{line}\n" + ("\n" + text if text else "")
    _write_atomic(user_config, body, mode)
    return True
